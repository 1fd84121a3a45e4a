//! Pod admission (upstream `pkg/kubelet/lifecycle/predicate.go` with the
//! scheduler's AdmissionCheck): before a new pod starts, the node checks
//! that it fits — pods, cpu, memory and ephemeral-storage requests against
//! allocatable, node selector and required node affinity, host ports, the
//! `kubernetes.io/os` label and field, and (except for static pods)
//! untolerated NoExecute taints. A rejected pod never starts; its status is
//! Failed with upstream's reason and message.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::nodestatus::quantity::parse_milli;

pub mod sysctl;

/// What admission checks a pod against: allocatable amounts and the node's
/// labels and taints.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Allocatable, in milli-units (millicores, millibytes).
    pub cpu_milli: i128,
    pub memory_milli: i128,
    pub ephemeral_milli: i128,
    pub pods: i64,
    /// The runtime applies `supplementalGroupsPolicy: Strict` (the Node's
    /// status.features.supplementalGroupsPolicy).
    pub supplemental_groups_policy: bool,
}

/// An admission refusal: upstream's reason (e.g. `OutOfcpu`) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// A pod's requests in milli-units: upstream's PodRequests (apps and
/// sidecars together, or the largest init container with the sidecars
/// started before it, whichever is more; the pod-level request instead
/// where the pod sets one for cpu, memory or huge pages), plus the pod
/// overhead.
pub fn pod_requests(pod: &Pod, resource: &str) -> i128 {
    let pod_level = || {
        let r = pod.spec.as_ref()?.resources.as_ref()?;
        let q = r.requests.as_ref()?.get(resource)?;
        Some(parse_milli(&q.0).unwrap_or(0))
    };
    let pod_level = crate::cm::is_pod_level_resource(resource)
        .then(pod_level)
        .flatten();
    let overhead = pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .and_then(|o| o.get(resource))
        .and_then(|q| parse_milli(&q.0))
        .unwrap_or(0);
    pod_level.unwrap_or_else(|| container_requests(pod, resource)) + overhead
}

/// What the containers request together (upstream
/// AggregateContainerRequests).
pub fn container_requests(pod: &Pod, resource: &str) -> i128 {
    aggregate(
        pod,
        |c| {
            amount(
                c.resources.as_ref().and_then(|r| r.requests.as_ref()),
                resource,
            )
        },
        |_| {},
    )
}

/// A resource's amount in a container's requests or limits, in milli-units.
fn amount(list: Option<&BTreeMap<String, Quantity>>, resource: &str) -> i128 {
    list.and_then(|r| r.get(resource))
        .and_then(|q| parse_milli(&q.0))
        .unwrap_or(0)
}

/// Upstream's sum over a pod's containers (AggregateContainerRequests and
/// AggregateContainerLimits): apps and sidecars together, or the largest
/// init container with the sidecars started before it, whichever is more.
/// `each` sees every container's amount as counted: an app's or sidecar's
/// own, an init container's with the sidecars before it.
fn aggregate(pod: &Pod, of: impl Fn(&Container) -> i128, mut each: impl FnMut(i128)) -> i128 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let mut apps = 0i128;
    for c in &spec.containers {
        let a = of(c);
        each(a);
        apps += a;
    }
    let mut sidecars = 0i128;
    let mut init_max = 0i128;
    for c in spec.init_containers.iter().flatten() {
        let counted = if c.restart_policy.as_deref() == Some("Always") {
            sidecars += of(c);
            sidecars
        } else {
            sidecars + of(c)
        };
        each(counted);
        init_max = init_max.max(counted);
    }
    (apps + sidecars).max(init_max)
}

/// A pod's limit in milli-units (upstream PodLimits: the containers' limits
/// summed as requests are, the pod-level limit instead where the pod sets
/// one, plus the overhead when there is a limit), and whether a limit is
/// declared: by every container as counted (an init container's with the
/// sidecars before it), or at pod level.
pub fn pod_limits(pod: &Pod, resource: &str) -> (i128, bool) {
    let mut declared = true;
    let mut total = aggregate(
        pod,
        |c| {
            amount(
                c.resources.as_ref().and_then(|r| r.limits.as_ref()),
                resource,
            )
        },
        |a| declared &= a != 0,
    );
    let pod_level = pod.spec.as_ref().and_then(|s| s.resources.as_ref());
    // Upstream IsPodLevelResourcesSet: any supported resource requested or
    // limited at pod level.
    let set = pod_level.is_some_and(|r| {
        r.requests
            .iter()
            .chain(r.limits.iter())
            .flat_map(|m| m.keys())
            .any(|k| crate::cm::is_pod_level_resource(k))
    });
    if set && crate::cm::is_pod_level_resource(resource) {
        if let Some(l) = pod_level
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(resource))
        {
            total = parse_milli(&l.0).unwrap_or(0);
            declared |= total != 0;
        }
    }
    if total != 0 {
        total += amount(
            pod.spec.as_ref().and_then(|s| s.overhead.as_ref()),
            resource,
        );
    }
    (total, declared)
}

fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let hp = p.host_port.filter(|h| *h > 0)?;
            let ip = p
                .host_ip
                .clone()
                .filter(|i| !i.is_empty())
                .unwrap_or("0.0.0.0".into());
            Some((ip, p.protocol.clone().unwrap_or_else(|| "TCP".into()), hp))
        })
        .collect()
}

/// Two host ports conflict when protocol and port match and either IP is
/// the wildcard or both are the same (upstream HostPortInfo.CheckConflict).
fn ports_conflict(a: &(String, String, i32), b: &(String, String, i32)) -> bool {
    a.1 == b.1 && a.2 == b.2 && (a.0 == "0.0.0.0" || b.0 == "0.0.0.0" || a.0 == b.0)
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(want)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|w| w.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > want
            } else {
                v < want
            }
        }
        _ => false,
    }
}

fn term_matches(t: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
    let fields = t.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing (upstream nodeaffinity).
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key)))
        && fields.iter().all(|r| {
            let name = node.name.clone();
            r.key == "metadata.name" && requirement_matches(r, Some(&name))
        })
}

/// nodeSelector and requiredDuringSchedulingIgnoredDuringExecution.
fn affinity_matches(pod: &Pod, node: &NodeFacts) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)));
    selector_ok && affinity_ok
}

/// Upstream ToleratesTaint.
pub(crate) fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        _ => {
            key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// Checks `pod` against the node and the pods already admitted (`others`,
/// not finished). Static pods skip the taint check, as upstream.
pub fn admit(
    pod: &Pod,
    others: &[&Pod],
    node: &NodeFacts,
    is_static: bool,
) -> Result<(), Rejection> {
    let spec = pod.spec.clone().unwrap_or_default();
    if pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"))
        .is_some_and(|os| os != "linux")
    {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                .into(),
        });
    }
    if spec.os.as_ref().is_some_and(|o| o.name != "linux") {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    // Upstream rejectPodAdmissionBasedOnSupplementalGroupsPolicy (the gate
    // is beta): Strict needs a runtime that applies it.
    let policy = spec
        .security_context
        .as_ref()
        .and_then(|s| s.supplemental_groups_policy.as_deref());
    if policy == Some("Strict") && !node.supplemental_groups_policy {
        return Err(Rejection {
            reason: "SupplementalGroupsPolicyNotSupported".into(),
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    // Resources first, in upstream's order: pods, then cpu, memory, storage.
    let used_pods = others.len() as i64;
    if used_pods + 1 > node.pods {
        return Err(Rejection {
            reason: "OutOfpods".into(),
            message: format!(
                "Node didn't have enough resource: pods, requested: 1, used: {used_pods}, capacity: {}",
                node.pods
            ),
        });
    }
    for (name, reason, cap, unit) in [
        ("cpu", "OutOfcpu", node.cpu_milli, 1),
        ("memory", "OutOfmemory", node.memory_milli, 1000),
        (
            "ephemeral-storage",
            "OutOfephemeral-storage",
            node.ephemeral_milli,
            1000,
        ),
    ] {
        let want = pod_requests(pod, name);
        if want == 0 {
            continue;
        }
        let used: i128 = others.iter().map(|p| pod_requests(p, name)).sum();
        if want + used > cap {
            return Err(Rejection {
                reason: reason.into(),
                message: format!(
                    "Node didn't have enough resource: {name}, requested: {}, used: {}, capacity: {}",
                    want / unit,
                    used / unit,
                    cap / unit
                ),
            });
        }
    }
    let predicate = |name: &str, desc: &str| Rejection {
        reason: name.into(),
        message: format!("Predicate {name} failed: {desc}"),
    };
    if !affinity_matches(pod, node) {
        return Err(predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name)
    {
        return Err(predicate(
            "NodeName",
            "node(s) didn't match the requested node name",
        ));
    }
    let taken: Vec<_> = others.iter().flat_map(|p| host_ports(p)).collect();
    let mut mine = HashSet::new();
    for p in host_ports(pod) {
        if taken.iter().any(|t| ports_conflict(t, &p)) || !mine.insert(p.clone()) {
            return Err(predicate(
                "NodePorts",
                "node(s) didn't have free ports for the requested pod ports",
            ));
        }
    }
    if !is_static {
        let tolerations = spec.tolerations.unwrap_or_default();
        let untolerated = node
            .taints
            .iter()
            .filter(|t| t.effect == "NoExecute")
            .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)));
        if untolerated {
            return Err(predicate(
                "TaintToleration",
                "node(s) had untolerated taint(s)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerPort, PodSecurityContext, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            labels: [("disk".to_string(), "ssd".to_string())].into(),
            taints: vec![],
            cpu_milli: 2000,
            memory_milli: 1000 * (1 << 30),
            ephemeral_milli: 1000 * (10 << 30),
            pods: 2,
            supplemental_groups_policy: false,
        }
    }

    fn pod(cpu: &str) -> Pod {
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        if !cpu.is_empty() {
            c.resources = Some(ResourceRequirements {
                requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
                ..Default::default()
            });
        }
        Pod {
            spec: Some(PodSpec {
                containers: vec![c],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_strict_supplemental_groups_policy_needs_a_runtime_that_applies_it() {
        // Old code: the policy was not looked at (upstream
        // rejectPodAdmissionBasedOnSupplementalGroupsPolicy).
        let mut p = pod("");
        let set = |p: &mut Pod, policy: &str| {
            p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
                supplemental_groups_policy: Some(policy.into()),
                ..Default::default()
            });
        };
        set(&mut p, "Strict");
        let r = admit(&p, &[], &node(), false).unwrap_err();
        assert_eq!(r.reason, "SupplementalGroupsPolicyNotSupported");
        assert_eq!(
            r.message,
            "SupplementalGroupsPolicy=Strict is not supported in this node"
        );
        let able = NodeFacts {
            supplemental_groups_policy: true,
            ..node()
        };
        assert!(admit(&p, &[], &able, false).is_ok());
        set(&mut p, "Merge");
        assert!(admit(&p, &[], &node(), false).is_ok());
    }

    #[test]
    fn resources_are_checked_with_upstreams_reasons_and_messages() {
        let n = node();
        assert!(admit(&pod("1500m"), &[], &n, false).is_ok());
        let big = pod("1500m");
        let e = admit(&pod("600m"), &[&big], &n, false).unwrap_err();
        assert_eq!(e.reason, "OutOfcpu");
        assert_eq!(
            e.message,
            "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
        );
        let (a, b) = (pod(""), pod(""));
        let e = admit(&pod(""), &[&a, &b], &n, false).unwrap_err();
        assert_eq!(e.reason, "OutOfpods");
        assert_eq!(
            e.message,
            "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
        );
    }

    #[test]
    fn selectors_ports_and_taints() {
        let n = node();
        let mut p = pod("");
        p.spec.as_mut().unwrap().node_selector =
            Some([("disk".to_string(), "hdd".to_string())].into());
        let e = admit(&p, &[], &n, false).unwrap_err();
        assert_eq!(e.reason, "NodeAffinity");
        assert_eq!(
            e.message,
            "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        );
        p.spec.as_mut().unwrap().node_selector =
            Some([("disk".to_string(), "ssd".to_string())].into());
        assert!(admit(&p, &[], &n, false).is_ok());

        let with_port = |port: i32| {
            let mut p = pod("");
            p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
                container_port: 80,
                host_port: Some(port),
                ..Default::default()
            }]);
            p
        };
        let running = with_port(8080);
        assert_eq!(
            admit(&with_port(8080), &[&running], &n, false)
                .unwrap_err()
                .reason,
            "NodePorts"
        );
        assert!(admit(&with_port(8081), &[&running], &n, false).is_ok());

        let mut tainted = node();
        tainted.taints = vec![Taint {
            key: "maintenance".into(),
            effect: "NoExecute".into(),
            ..Default::default()
        }];
        assert_eq!(
            admit(&pod(""), &[], &tainted, false).unwrap_err().reason,
            "TaintToleration"
        );
        assert!(
            admit(&pod(""), &[], &tainted, true).is_ok(),
            "static pods skip taints"
        );
        let mut tolerant = pod("");
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("maintenance".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(admit(&tolerant, &[], &tainted, false).is_ok());
    }

    #[test]
    fn sidecars_and_init_containers_count_as_upstreams_pod_requests() {
        let mut p = pod("100m");
        let init = |name: &str, cpu: &str, always: bool| Container {
            name: name.into(),
            restart_policy: always.then(|| "Always".into()),
            resources: Some(ResourceRequirements {
                requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().init_containers =
            Some(vec![init("side", "200m", true), init("big", "1", false)]);
        // max(apps 100m + sidecar 200m, sidecar 200m + init 1000m) = 1200m
        assert_eq!(pod_requests(&p, "cpu"), 1200);
        // A pod-level request stands for the containers' (PodRequests with
        // PodLevelResources); the overhead still adds to it. Old code: the
        // pod-level request was ignored.
        let spec = p.spec.as_mut().unwrap();
        spec.resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("2".into()))].into()),
            ..Default::default()
        });
        spec.overhead = Some([("cpu".to_string(), Quantity("50m".into()))].into());
        assert_eq!(pod_requests(&p, "cpu"), 2050);
        assert_eq!(pod_requests(&p, "memory"), 0);
    }
}
