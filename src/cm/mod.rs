//! Container manager pieces the runtime manager needs now: QoS class, pod
//! cgroup parents under `kubepods`, CPU/memory settings and OOM scores
//! (upstream `pkg/kubelet/cm`, `qos/policy.go`, `apis/core/v1/helper/qos`).

pub mod cpumanager;
pub mod manager;
pub mod node;
pub mod podcgroups;
pub mod quantity;
pub mod system;

use k8s_openapi::api::core::v1::{Container, Pod};

use quantity::{parse_bytes, parse_cpu_millis};

/// Upstream's CgroupV1MaintenanceModeWarning, logged and sent as the
/// node's `CgroupV1` event on a cgroup v1 host.
pub const CGROUP_V1_WARNING: &str =
    "cgroup v1 support is in maintenance mode, please migrate to cgroup v2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// A container's effective requests and limits for cpu (millicores) and memory
/// (bytes). A request left unset while its limit is set takes the limit, as
/// the API server's defaulting does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request: Option<i64>,
    pub cpu_limit: Option<i64>,
    pub mem_request: Option<i64>,
    pub mem_limit: Option<i64>,
}

pub fn container_resources(c: &Container) -> Resources {
    let r = c.resources.as_ref();
    let get = |which: fn(
        &k8s_openapi::api::core::v1::ResourceRequirements,
    ) -> Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
               key: &str| {
        r.and_then(which)
            .and_then(|m| m.get(key))
            .map(|q| q.0.clone())
    };
    let cpu_limit = get(|r| r.limits.as_ref(), "cpu").and_then(|q| parse_cpu_millis(&q).ok());
    let mem_limit = get(|r| r.limits.as_ref(), "memory").and_then(|q| parse_bytes(&q).ok());
    let cpu_request = get(|r| r.requests.as_ref(), "cpu")
        .and_then(|q| parse_cpu_millis(&q).ok())
        .or(cpu_limit);
    let mem_request = get(|r| r.requests.as_ref(), "memory")
        .and_then(|q| parse_bytes(&q).ok())
        .or(mem_limit);
    Resources {
        cpu_request,
        cpu_limit,
        mem_request,
        mem_limit,
    }
}

/// Upstream GetPodQOS: the class the API server recorded at creation
/// (`status.qosClass`, immutable: a status write with another is refused),
/// else `compute_pod_qos`.
pub fn pod_qos(pod: &Pod) -> QosClass {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        Some("BestEffort") => QosClass::BestEffort,
        _ => compute_pod_qos(pod),
    }
}

type ResourceList =
    std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

/// Upstream ComputePodQOS: over the pod-level resources when the pod has
/// any (`spec.resources`, PodLevelResources, beta and on in 1.34), else
/// over its containers and init containers, the positive cpu and memory
/// requests and limits are summed. BestEffort when there are none;
/// Guaranteed when each sum of requests equals its sum of limits and every
/// container (or the pod) limits both cpu and memory; else Burstable.
pub fn compute_pod_qos(pod: &Pod) -> QosClass {
    // Milli-units per resource (cpu, memory); None: nothing positive.
    let mut requests = [None::<i128>; 2];
    let mut limits = [None::<i128>; 2];
    let mut guaranteed = true;
    let add = |sums: &mut [Option<i128>; 2], list: Option<&ResourceList>| {
        let mut found = [false; 2];
        for (i, name) in ["cpu", "memory"].iter().enumerate() {
            let v = list
                .and_then(|l| l.get(*name))
                .and_then(|q| quantity::parse_milli(&q.0).ok())
                .unwrap_or(0);
            if v > 0 {
                sums[i] = Some(sums[i].unwrap_or(0) + v);
                found[i] = true;
            }
        }
        found
    };
    let spec = pod.spec.as_ref();
    match spec.and_then(|s| s.resources.as_ref()) {
        Some(r) => {
            add(&mut requests, r.requests.as_ref());
            if r.limits.as_ref().is_some_and(|l| !l.is_empty())
                && add(&mut limits, r.limits.as_ref()) != [true, true]
            {
                guaranteed = false;
            }
        }
        None => {
            let containers = spec.into_iter().flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            });
            for c in containers {
                let r = c.resources.as_ref();
                // A request left unset takes its limit (the API server's
                // defaulting, which static pods get from the file source).
                let mut req = r.and_then(|r| r.requests.clone()).unwrap_or_default();
                for (k, v) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
                    req.entry(k.clone()).or_insert_with(|| v.clone());
                }
                add(&mut requests, Some(&req));
                if add(&mut limits, r.and_then(|r| r.limits.as_ref())) != [true, true] {
                    guaranteed = false;
                }
            }
        }
    }
    if requests == [None, None] && limits == [None, None] {
        return QosClass::BestEffort;
    }
    let matched = (0..2).all(|i| requests[i].is_none() || requests[i] == limits[i])
        && requests.iter().flatten().count() == limits.iter().flatten().count();
    if guaranteed && matched {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The pod's cgroup parent for the cgroupfs driver: Guaranteed pods sit
/// directly under kubepods, the others under their QoS class.
pub fn pod_cgroup_parent(pod: &Pod, cgroup_root: &str, systemd: bool) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let qos = pod_qos(pod);
    if systemd {
        let uid = uid.replace('-', "_");
        return match qos {
            QosClass::Guaranteed => format!("kubepods-pod{uid}.slice"),
            QosClass::Burstable => format!("kubepods-burstable-pod{uid}.slice"),
            QosClass::BestEffort => format!("kubepods-besteffort-pod{uid}.slice"),
        };
    }
    let root = cgroup_root.trim_end_matches('/');
    match qos {
        QosClass::Guaranteed => format!("{root}/kubepods/pod{uid}"),
        QosClass::Burstable => format!("{root}/kubepods/burstable/pod{uid}"),
        QosClass::BestEffort => format!("{root}/kubepods/besteffort/pod{uid}"),
    }
}

/// Upstream MilliCPUToShares: min 2, max 262144.
pub fn cpu_shares(milli: Option<i64>) -> i64 {
    match milli {
        None | Some(0) => 2,
        Some(m) => (m * 1024 / 1000).clamp(2, 262_144),
    }
}

/// Upstream's QuotaPeriod, the CFS period without CustomCPUCFSQuotaPeriod.
pub const CPU_PERIOD_US: i64 = 100_000;

/// How cpu limits become CFS quotas: `cpuCFSQuota` (whether they do at
/// all) and the period (`cpuCFSQuotaPeriod` with CustomCPUCFSQuotaPeriod,
/// else 100 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cfs {
    pub enforce: bool,
    pub period_us: i64,
}

impl Default for Cfs {
    fn default() -> Self {
        Cfs {
            enforce: true,
            period_us: CPU_PERIOD_US,
        }
    }
}

/// Set once at start from the configuration; read wherever container
/// resources are made or compared.
static CFS: std::sync::OnceLock<Cfs> = std::sync::OnceLock::new();

/// Sets the node's CFS settings (at start; later calls are ignored).
pub fn set_cfs(c: Cfs) {
    let _ = CFS.set(c);
}

/// The node's CFS settings.
pub fn cfs() -> Cfs {
    CFS.get().copied().unwrap_or_default()
}

impl Cfs {
    /// From the configuration, as upstream's kuberuntime manager takes it.
    pub fn from_config(cfg: &crate::config::KubeletConfiguration) -> Self {
        Cfs {
            enforce: cfg.cpu_cfs_quota,
            period_us: if cfg.feature_gate("CustomCPUCFSQuotaPeriod") {
                cfg.cpu_cfs_quota_period.0.as_micros() as i64
            } else {
                CPU_PERIOD_US
            },
        }
    }

    /// The period and quota a cpu limit is set as: with quotas enforced
    /// the period always, and a quota of 0 (none) without a limit (upstream
    /// calculateLinuxResources); zeros when quotas are not enforced.
    pub fn period_and_quota(self, milli: Option<i64>) -> (i64, i64) {
        match milli {
            _ if !self.enforce => (0, 0),
            Some(m) if m > 0 => (self.period_us, cpu_quota_over(m, self.period_us)),
            _ => (self.period_us, 0),
        }
    }
}

/// Upstream MilliCPUToQuota: the quota floor is 1 ms.
fn cpu_quota_over(milli: i64, period_us: i64) -> i64 {
    (milli * period_us / 1000).max(1000)
}

/// The quota of a cpu limit over the node's period (0 without one).
pub fn cpu_quota(milli: Option<i64>) -> i64 {
    match milli {
        None | Some(0) => 0,
        Some(m) => cpu_quota_over(m, cfs().period_us),
    }
}

/// Upstream IsCriticalPod: static, mirror, or of system-critical priority
/// (scheduling.SystemCriticalPriority).
pub fn is_critical(pod: &Pod) -> bool {
    const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
    crate::status::apisync::is_static_pod(pod)
        || crate::source::api::is_mirror_pod(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Upstream IsNodeCriticalPod: a critical pod of priority class
/// `system-node-critical`.
pub fn is_node_critical(pod: &Pod) -> bool {
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref());
    class == Some("system-node-critical") && is_critical(pod)
}

/// A resource a pod may set at pod level (upstream
/// IsSupportedPodLevelResource): cpu, memory and huge pages.
pub fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// The pod-level memory request not given to any container, shared out
/// among them (upstream remainingPodMemReqPerContainer); None when the pod
/// sets no pod-level request (upstream IsPodLevelRequestsSet).
fn pod_memory_share(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let requests = spec.resources.as_ref()?.requests.as_ref()?;
    if !requests.keys().any(|k| is_pod_level_resource(k)) {
        return None;
    }
    let Some(total) = requests
        .get("memory")
        .and_then(|q| parse_bytes(&q.0).ok())
        .filter(|m| *m != 0)
    else {
        return Some(0);
    };
    let n = (spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len)) as i64;
    // The containers' own requests, counted as admission counts them
    // (in milli-units there).
    let own = (crate::lifecycle::container_requests(pod, "memory") / 1000) as i64;
    Some((total - own) / n.max(1))
}

/// Upstream qos policy `GetContainerOOMScoreAdjust`: node-critical and
/// Guaranteed pods -997, BestEffort 1000, Burstable from the container's
/// memory request (plus its share of the pod-level request) against the
/// machine's memory, a sidecar no higher than the pod's smallest regular
/// container, and kept within 3..=999.
pub fn oom_score_adj(pod: &Pod, c: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical(pod) {
        return -997;
    }
    match pod_qos(pod) {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let capacity = memory_capacity.max(1);
            let share = pod_memory_share(pod).unwrap_or(0);
            let adj_for = |req: i64| 1000 - (1000 * (req + share)) / capacity;
            let request = |c: &Container| container_resources(c).mem_request.unwrap_or(0);
            let mut adj = adj_for(request(c));
            let spec = pod.spec.as_ref();
            let sidecar = c.restart_policy.as_deref() == Some("Always")
                && spec
                    .and_then(|s| s.init_containers.as_ref())
                    .is_some_and(|i| i.iter().any(|i| i.name == c.name));
            if sidecar {
                let smallest = spec
                    .into_iter()
                    .flat_map(|s| s.containers.iter())
                    .map(request)
                    .min()
                    .unwrap_or(0);
                adj = adj.min(adj_for(smallest));
            }
            // Burstable stays above Guaranteed (1000-997) and below BestEffort.
            adj.clamp(1000 - 997, 999)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod_with(req: &[(&str, &str)], lim: &[(&str, &str)]) -> Pod {
        let m = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            )
        };
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "a".into(),
                    resources: Some(ResourceRequirements {
                        requests: m(req),
                        limits: m(lim),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn qos_classes_follow_upstream_rules() {
        assert_eq!(pod_qos(&pod_with(&[], &[])), QosClass::BestEffort);
        assert_eq!(
            pod_qos(&pod_with(&[("cpu", "100m")], &[])),
            QosClass::Burstable
        );
        assert_eq!(
            pod_qos(&pod_with(&[], &[("cpu", "1"), ("memory", "64Mi")])),
            QosClass::Guaranteed
        );
        assert_eq!(
            pod_qos(&pod_with(
                &[("cpu", "500m")],
                &[("cpu", "1"), ("memory", "64Mi")]
            )),
            QosClass::Burstable
        );
    }

    fn list(kv: &[(&str, &str)]) -> Option<std::collections::BTreeMap<String, Quantity>> {
        Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    }

    /// `pod` with pod-level requests and limits (`spec.resources`).
    fn pod_level(mut pod: Pod, req: &[(&str, &str)], lim: &[(&str, &str)]) -> Pod {
        pod.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            requests: list(req),
            limits: list(lim),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn pod_level_resources_and_the_recorded_class_decide_the_qos() {
        // Old code: spec.resources was ignored (a pod sized only there was
        // BestEffort), and the class the API server recorded was not
        // looked at, so rkubelet's status could carry another one, which
        // the API server refuses (status.qosClass is immutable).
        let bare = pod_with(&[], &[]);
        let both = [("cpu", "1"), ("memory", "64Mi")];
        assert_eq!(
            compute_pod_qos(&pod_level(bare.clone(), &both, &both)),
            QosClass::Guaranteed
        );
        assert_eq!(
            compute_pod_qos(&pod_level(bare.clone(), &[("cpu", "500m")], &[])),
            QosClass::Burstable
        );
        // Limits on one resource only: not Guaranteed.
        assert_eq!(
            compute_pod_qos(&pod_level(bare.clone(), &[("cpu", "1")], &[("cpu", "1")])),
            QosClass::Burstable
        );
        // Pod-level resources replace the containers' in the decision.
        let sized = pod_with(&[], &both);
        assert_eq!(compute_pod_qos(&sized), QosClass::Guaranteed);
        assert_eq!(
            compute_pod_qos(&pod_level(sized.clone(), &[("cpu", "1")], &[])),
            QosClass::Burstable
        );
        // Sums: two containers with equal requests and limits.
        let mut two = pod_with(&[], &both);
        let c = two.spec.as_ref().unwrap().containers[0].clone();
        two.spec.as_mut().unwrap().containers.push(Container {
            name: "b".into(),
            ..c
        });
        assert_eq!(compute_pod_qos(&two), QosClass::Guaranteed);
        // Zero quantities count for nothing.
        assert_eq!(
            compute_pod_qos(&pod_with(&[("cpu", "0")], &[])),
            QosClass::BestEffort
        );
        // The recorded class wins.
        let mut recorded = pod_with(&[], &[]);
        recorded.status = Some(k8s_openapi::api::core::v1::PodStatus {
            qos_class: Some("Burstable".into()),
            ..Default::default()
        });
        assert_eq!(pod_qos(&recorded), QosClass::Burstable);
        assert_eq!(compute_pod_qos(&recorded), QosClass::BestEffort);
    }

    #[test]
    fn oom_scores_as_upstreams_policy() {
        // Old code: no node-critical rule, no sidecar rule, no share of a
        // pod-level memory request (qos/policy.go in v1.34).
        let cap = 1000 << 20;
        let c = |p: &Pod| p.spec.as_ref().unwrap().containers[0].clone();
        let burstable = pod_with(&[("memory", "100Mi")], &[]);
        assert_eq!(oom_score_adj(&burstable, &c(&burstable), cap), 900);
        assert_eq!(
            oom_score_adj(&pod_with(&[], &[]), &c(&burstable), cap),
            1000
        );
        // system-node-critical and critical (static, mirror or of
        // system-critical priority): -997 whatever its class.
        let mut critical = pod_with(&[], &[]);
        critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        assert_eq!(
            oom_score_adj(&critical, &c(&critical), cap),
            1000,
            "not critical yet"
        );
        critical.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert_eq!(oom_score_adj(&critical, &c(&critical), cap), -997);
        // A pod-level memory request beyond the containers' is shared out:
        // (500Mi - 100Mi) over two containers adds 200Mi to each.
        let mut shared = pod_level(burstable.clone(), &[("memory", "500Mi")], &[]);
        let spec = shared.spec.as_mut().unwrap();
        spec.containers.push(Container {
            name: "b".into(),
            ..Default::default()
        });
        assert_eq!(oom_score_adj(&shared, &c(&shared), cap), 700);
        let b = shared.spec.as_ref().unwrap().containers[1].clone();
        assert_eq!(oom_score_adj(&shared, &b, cap), 800);
        // A sidecar scores no higher than the smallest regular container.
        let mut with_sidecar = pod_with(&[("memory", "100Mi")], &[]);
        let sidecar = Container {
            name: "side".into(),
            restart_policy: Some("Always".into()),
            resources: Some(ResourceRequirements {
                requests: list(&[("memory", "10Mi")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        with_sidecar.spec.as_mut().unwrap().init_containers = Some(vec![sidecar.clone()]);
        assert_eq!(oom_score_adj(&with_sidecar, &sidecar, cap), 900);
    }

    #[test]
    fn cpu_limits_become_cfs_quotas_as_the_configuration_says() {
        // Old code: cpuCFSQuota and cpuCFSQuotaPeriod were accepted unread.
        let on = Cfs::default();
        assert_eq!(on.period_and_quota(Some(500)), (100_000, 50_000));
        assert_eq!(on.period_and_quota(None), (100_000, 0));
        let off = Cfs {
            enforce: false,
            ..Cfs::default()
        };
        assert_eq!(off.period_and_quota(Some(500)), (0, 0));
        // CustomCPUCFSQuotaPeriod: 5 ms periods, the 1 ms floor kept.
        let short = Cfs {
            enforce: true,
            period_us: 5_000,
        };
        assert_eq!(short.period_and_quota(Some(500)), (5_000, 2_500));
        assert_eq!(short.period_and_quota(Some(100)), (5_000, 1_000));
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
            cpuCFSQuota: false\nfeatureGates:\n  CustomCPUCFSQuotaPeriod: true\ncpuCFSQuotaPeriod: 5ms\n";
        let (cfg, _) = crate::config::KubeletConfiguration::load_str(text).unwrap();
        assert_eq!(
            Cfs::from_config(&cfg),
            Cfs {
                enforce: false,
                period_us: 5_000
            }
        );
    }

    #[test]
    fn cpu_conversions_match_upstream() {
        assert_eq!(cpu_shares(None), 2);
        assert_eq!(cpu_shares(Some(1)), 2);
        assert_eq!(cpu_shares(Some(100)), 102);
        assert_eq!(cpu_shares(Some(1000)), 1024);
        assert_eq!(cpu_quota(Some(250)), 25_000);
        assert_eq!(cpu_quota(Some(5)), 1000);
    }

    #[test]
    fn cgroup_parents_by_qos() {
        let mut p = pod_with(&[], &[]);
        p.metadata.uid = Some("abc-1".into());
        assert_eq!(
            pod_cgroup_parent(&p, "", false),
            "/kubepods/besteffort/podabc-1"
        );
        assert_eq!(
            pod_cgroup_parent(&p, "", true),
            "kubepods-besteffort-podabc_1.slice"
        );
    }
}
