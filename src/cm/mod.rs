//! Container manager pieces the runtime manager needs now: QoS class, pod
//! cgroup parents under `kubepods`, CPU/memory settings and OOM scores
//! (upstream `pkg/kubelet/cm`, `qos/policy.go`, `apis/core/v1/helper/qos`).

pub mod podcgroups;
pub mod quantity;

use k8s_openapi::api::core::v1::{Container, Pod};

use quantity::{parse_bytes, parse_cpu_millis};

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

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.into_iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// Upstream GetPodQOS: Guaranteed when every container sets equal cpu and
/// memory requests and limits; BestEffort when nobody sets any.
pub fn pod_qos(pod: &Pod) -> QosClass {
    let mut any = false;
    let mut guaranteed = true;
    for c in all_containers(pod) {
        let r = container_resources(c);
        if r.cpu_request.is_some()
            || r.mem_request.is_some()
            || r.cpu_limit.is_some()
            || r.mem_limit.is_some()
        {
            any = true;
        }
        let full = r.cpu_limit.is_some() && r.mem_limit.is_some();
        if !full || r.cpu_request != r.cpu_limit || r.mem_request != r.mem_limit {
            guaranteed = false;
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
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

/// Upstream MilliCPUToQuota with a 100 ms period; the quota floor is 1 ms.
pub const CPU_PERIOD_US: i64 = 100_000;
pub fn cpu_quota(milli: Option<i64>) -> i64 {
    match milli {
        None | Some(0) => 0,
        Some(m) => (m * CPU_PERIOD_US / 1000).max(1000),
    }
}

/// Upstream qos policy `GetContainerOOMScoreAdjust`.
pub fn oom_score_adj(pod: &Pod, c: &Container, memory_capacity: i64) -> i64 {
    match pod_qos(pod) {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let req = container_resources(c).mem_request.unwrap_or(0);
            let adj = 1000 - (1000 * req) / memory_capacity.max(1);
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
