//! computePodActions: compare a pod's spec with what the runtime runs and
//! decide what to kill, create and start (upstream
//! `kuberuntime_manager.go` computePodActions and its helpers). Pure: the
//! caller executes the actions.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::hash;
use super::pod_status::{CState, ContainerInfo, RuntimePod};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillContainer {
    pub id: String,
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox of the pod first.
    pub kill_pod: bool,
    pub create_sandbox: bool,
    /// The sandbox to use when not creating one.
    pub sandbox_id: Option<String>,
    pub attempt: u32,
    /// Indexes into `initContainers` to start: the next regular init
    /// container, or sidecars (init containers with restartPolicy Always).
    pub init_to_start: Vec<usize>,
    /// Indexes into `containers` to start.
    pub containers_to_start: Vec<usize>,
    /// Indexes into `ephemeralContainers` to start: those never started.
    pub ephemeral_to_start: Vec<usize>,
    pub containers_to_kill: Vec<KillContainer>,
    /// Running containers whose cgroup settings an in-place resize changes
    /// without a restart: (container id, name).
    pub containers_to_update: Vec<(String, String)>,
}

/// What an in-place resize changes of a running container: whether its cpu
/// settings (shares, quota, period) and its memory limit differ from what
/// the spec asks for. Unknown (the runtime reports no settings) is no
/// change: nothing is restarted or updated on a guess.
pub fn resize_changes(c: &Container, s: &ContainerInfo) -> (bool, bool) {
    let Some(have) = s.resources.as_ref() else {
        return (false, false);
    };
    let r = crate::cm::container_resources(c);
    let (period, quota) = crate::cm::cfs().period_and_quota(r.cpu_limit);
    // The period matters only under a quota (a runtime may report an
    // unset one as 0 or as its default).
    let period_differs = (quota > 0 || have.cpu_quota > 0) && have.cpu_period != period;
    let cpu = have.cpu_shares != crate::cm::cpu_shares(r.cpu_request)
        || have.cpu_quota.max(0) != quota
        || period_differs;
    let memory = have.memory_limit_in_bytes.max(0) != r.mem_limit.unwrap_or(0);
    (cpu, memory)
}

/// Whether a resize of `resource` ("cpu", "memory") restarts the container
/// (its resizePolicy says RestartContainer; NotRequired is the default).
fn resize_restarts(c: &Container, resource: &str) -> bool {
    c.resize_policy
        .iter()
        .flatten()
        .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

/// Adds an in-place resize of running container `c` to the actions: a
/// restart when a changed resource's policy asks for one, else an update.
/// Returns true when the container is restarted.
fn resize(
    c: &Container,
    s: &ContainerInfo,
    start: impl FnOnce(&mut PodActions),
    a: &mut PodActions,
) -> bool {
    let (cpu, memory) = resize_changes(c, s);
    if !cpu && !memory {
        return false;
    }
    if (cpu && resize_restarts(c, "cpu")) || (memory && resize_restarts(c, "memory")) {
        start(a);
        a.containers_to_kill.push(KillContainer {
            id: s.id.clone(),
            name: c.name.clone(),
            reason: format!("Container {} resize requires restart", c.name),
        });
        return true;
    }
    a.containers_to_update.push((s.id.clone(), c.name.clone()));
    false
}

/// What the probes say about the pod's running containers, by name.
#[derive(Debug, Clone, Default)]
pub struct ProbeState {
    /// Liveness or startup probe failed for the current instance.
    pub failed: HashSet<String>,
    /// Startup probe has not succeeded yet for the current instance.
    pub not_started: HashSet<String>,
}

/// A sidecar: an init container with `restartPolicy: Always`.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

fn should_restart_on_failure(pod: &Pod) -> bool {
    restart_policy(pod) != "Never"
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

fn app_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[])
}

/// The pod's ephemeral containers (`kubectl debug`) as containers, as
/// upstream converts EphemeralContainerCommon: the same fields, less the
/// target. Empty for almost every pod, so the round trip costs nothing there.
pub fn ephemeral_containers(pod: &Pod) -> Vec<(Container, Option<String>)> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|e| {
            let mut v = serde_json::to_value(e).ok()?;
            let target = v
                .as_object_mut()?
                .remove("targetContainerName")
                .and_then(|t| t.as_str().map(String::from))
                .filter(|t| !t.is_empty());
            Some((serde_json::from_value(v).ok()?, target))
        })
        .collect()
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Upstream `podSandboxChanged`: (create a new sandbox?, attempt, current id).
fn sandbox_changed(pod: &Pod, rt: &RuntimePod) -> (bool, u32, Option<String>) {
    let Some(newest) = rt.sandboxes.first() else {
        return (true, 0, None);
    };
    let ready = rt.sandboxes.iter().filter(|s| s.ready).count();
    let id = Some(newest.id.clone());
    if ready > 1 || !newest.ready {
        return (true, newest.attempt + 1, id);
    }
    if newest.host_network != host_network(pod) {
        return (true, newest.attempt + 1, None);
    }
    if !newest.host_network && newest.ips.is_empty() {
        return (true, newest.attempt + 1, id);
    }
    (false, newest.attempt, id)
}

/// Walks the init containers in order (upstream computeInitContainerActions):
/// regular ones must finish with success one after the other; a sidecar must
/// be running (and started, per its startup probe) before the next one runs.
/// Returns whether initialization is complete.
fn init_actions(pod: &Pod, rt: &RuntimePod, probes: &ProbeState, a: &mut PodActions) -> bool {
    for (i, c) in init_containers(pod).iter().enumerate() {
        let s = rt.latest(&c.name);
        if is_sidecar(c) {
            match s.map(|s| s.state) {
                Some(CState::Running) if probes.not_started.contains(&c.name) => return false,
                Some(CState::Running) => continue,
                _ => {
                    kill_if_unknown(s, a);
                    a.init_to_start.push(i);
                    return false;
                }
            }
        }
        match s {
            None
            | Some(ContainerInfo {
                state: CState::Created,
                ..
            }) => {
                a.init_to_start.push(i);
                return false;
            }
            Some(s) if s.state == CState::Running => return false,
            Some(s) if !s.failed() => continue,
            Some(s) => {
                if should_restart_on_failure(pod) {
                    kill_if_unknown(Some(s), a);
                    a.init_to_start.push(i);
                } else {
                    a.kill_pod = true;
                }
                return false;
            }
        }
    }
    true
}

fn kill_if_unknown(s: Option<&ContainerInfo>, a: &mut PodActions) {
    if let Some(s) = s.filter(|s| s.state == CState::Unknown) {
        a.containers_to_kill.push(KillContainer {
            id: s.id.clone(),
            name: s.name.clone(),
            reason: "container in unknown state".into(),
        });
    }
}

/// Upstream `ShouldContainerBeRestarted`.
pub fn should_start(c: &Container, pod: &Pod, rt: &RuntimePod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(s) = rt.latest(&c.name) else {
        return true;
    };
    match s.state {
        CState::Running => false,
        CState::Created | CState::Unknown => true,
        CState::Exited => match restart_policy(pod) {
            "Never" => false,
            "OnFailure" => s.exit_code != 0,
            _ => true,
        },
    }
}

pub fn compute_pod_actions(pod: &Pod, rt: &RuntimePod, probes: &ProbeState) -> PodActions {
    let (create, attempt, sandbox_id) = sandbox_changed(pod, rt);
    let mut a = PodActions {
        kill_pod: create,
        create_sandbox: create,
        sandbox_id,
        attempt,
        ..Default::default()
    };

    if create {
        // A Never pod whose containers already ran is not started again.
        if !should_restart_on_failure(pod) && attempt != 0 && !rt.containers.is_empty() {
            a.create_sandbox = false;
            return a;
        }
        let to_start: Vec<usize> = app_containers(pod)
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !(restart_policy(pod) == "OnFailure"
                    && rt
                        .latest(&c.name)
                        .is_some_and(|s| s.state == CState::Exited && s.exit_code == 0))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() {
            a.create_sandbox = false;
            return a;
        }
        if !init_containers(pod).is_empty() {
            a.init_to_start = vec![0];
            return a;
        }
        a.containers_to_start = to_start;
        return a;
    }

    // Ephemeral containers start once each, even before initialization
    // completes, and are never restarted (upstream computePodActions).
    if pod.metadata.deletion_timestamp.is_none() {
        let names = pod
            .spec
            .iter()
            .flat_map(|s| s.ephemeral_containers.iter().flatten());
        a.ephemeral_to_start = names
            .enumerate()
            .filter(|(_, e)| rt.latest(&e.name).is_none())
            .map(|(i, _)| i)
            .collect();
    }

    // Initialization ran once an app container ran in this sandbox; after
    // that only sidecars are (re)started, never regular init containers.
    let current = a.sandbox_id.as_deref();
    let apps_started = app_containers(pod).iter().any(|c| {
        rt.latest(&c.name)
            .is_some_and(|s| s.state == CState::Running || Some(s.sandbox_id.as_str()) == current)
    });
    if !apps_started && !init_actions(pod, rt, probes, &mut a) {
        return a;
    }

    let mut keep = 0;
    for (idx, c) in app_containers(pod).iter().enumerate() {
        let status = rt.latest(&c.name);
        let Some(s) = status.filter(|s| s.state == CState::Running) else {
            if should_start(c, pod, rt) {
                a.containers_to_start.push(idx);
                if let Some(s) = status.filter(|s| s.state == CState::Unknown) {
                    a.containers_to_kill.push(KillContainer {
                        id: s.id.clone(),
                        name: s.name.clone(),
                        reason: "container in unknown state".into(),
                    });
                }
            }
            continue;
        };
        if hash::spec_changed(c, s.recorded()) {
            // A changed spec restarts the container whatever the policy.
            a.containers_to_start.push(idx);
            a.containers_to_kill.push(KillContainer {
                id: s.id.clone(),
                name: c.name.clone(),
                reason: format!("Container {} definition changed, will be restarted", c.name),
            });
            continue;
        }
        if probes.failed.contains(&c.name) {
            // Killed on a liveness (or startup) failure; restarted unless Never.
            if should_restart_on_failure(pod) {
                a.containers_to_start.push(idx);
            }
            a.containers_to_kill.push(KillContainer {
                id: s.id.clone(),
                name: c.name.clone(),
                reason: format!(
                    "Container {} failed liveness probe, will be restarted",
                    c.name
                ),
            });
            continue;
        }
        if resize(c, s, |a| a.containers_to_start.push(idx), &mut a) {
            continue;
        }
        keep += 1;
    }
    if keep == 0 && a.containers_to_start.is_empty() {
        // Nothing left to run: the pod is done, sidecars and debuggers
        // included.
        a.kill_pod = true;
        a.ephemeral_to_start.clear();
        return a;
    }
    // Sidecars keep running beside the app containers.
    for (i, c) in init_containers(pod)
        .iter()
        .enumerate()
        .filter(|(_, c)| is_sidecar(c))
    {
        let s = rt.latest(&c.name);
        match s {
            Some(s) if s.state == CState::Running && probes.failed.contains(&c.name) => {
                a.containers_to_kill.push(KillContainer {
                    id: s.id.clone(),
                    name: c.name.clone(),
                    reason: format!(
                        "Container {} failed liveness probe, will be restarted",
                        c.name
                    ),
                });
                a.init_to_start.push(i);
            }
            Some(s) if s.state == CState::Running => {
                resize(c, s, |a| a.init_to_start.push(i), &mut a);
            }
            _ => {
                kill_if_unknown(s, &mut a);
                a.init_to_start.push(i);
            }
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::pod_status::SandboxInfo;

    use crate::testutil::pod;

    fn sandbox(ready: bool) -> SandboxInfo {
        SandboxInfo {
            id: "sb1".into(),
            ready,
            attempt: 0,
            created_at: 1,
            ips: vec!["10.88.0.2".into()],
            host_network: false,
        }
    }

    fn ctr(p: &Pod, name: &str, state: CState, exit: i32, at: i64) -> ContainerInfo {
        let spec = p.spec.as_ref().unwrap();
        let c = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .unwrap();
        ContainerInfo {
            id: format!("{name}-{at}"),
            name: name.into(),
            sandbox_id: "sb1".into(),
            state,
            init: false,
            restart_count: 0,
            hash: Some(hash::container_hash(c)),
            spec_version: Some("1".into()),
            upstream_hash: Some(hash::upstream_hash(c)),
            created_at: at,
            started_at: at,
            finished_at: at,
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            pod_grace: None,
            pre_stop: None,
            resources: None,
            user: None,
        }
    }

    fn rt(sb: Vec<SandboxInfo>, cs: Vec<ContainerInfo>) -> RuntimePod {
        let mut r = RuntimePod {
            uid: "u".into(),
            sandboxes: sb,
            containers: cs,
        };
        r.sort();
        r
    }

    /// Old code: a spec whose resources changed was left as it ran (no
    /// in-place resize at all).
    #[test]
    fn a_resize_updates_or_restarts_as_the_policy_says() {
        use k8s_openapi::api::core::v1::{ContainerResizePolicy, ResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut p = pod("Always", &[], &["app"]);
        let limits = |cpu: &str, mem: &str| ResourceRequirements {
            limits: Some(
                [
                    ("cpu".to_string(), Quantity(cpu.into())),
                    ("memory".to_string(), Quantity(mem.into())),
                ]
                .into(),
            ),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().containers[0].resources = Some(limits("200m", "64Mi"));
        // What the runtime applied: the spec's settings at first.
        let applied = |cpu_milli: i64, mem: i64| crate::cri::v1::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: cpu_milli * 100,
            cpu_shares: crate::cm::cpu_shares(Some(cpu_milli)),
            memory_limit_in_bytes: mem,
            ..Default::default()
        };
        let mut c = ctr(&p, "app", CState::Running, 0, 10);
        c.resources = Some(applied(200, 64 << 20));
        let probes = ProbeState::default();
        let a = compute_pod_actions(&p, &rt(vec![sandbox(true)], vec![c.clone()]), &probes);
        assert!(a.containers_to_update.is_empty() && a.containers_to_kill.is_empty());
        // Unknown settings: nothing is done on a guess.
        let mut unknown = c.clone();
        unknown.resources = None;
        p.spec.as_mut().unwrap().containers[0].resources = Some(limits("400m", "64Mi"));
        let a = compute_pod_actions(&p, &rt(vec![sandbox(true)], vec![unknown]), &probes);
        assert!(a.containers_to_update.is_empty());

        // More cpu, NotRequired by default: updated in place.
        let a = compute_pod_actions(&p, &rt(vec![sandbox(true)], vec![c.clone()]), &probes);
        assert_eq!(
            a.containers_to_update,
            vec![("app-10".to_string(), "app".to_string())]
        );
        assert!(a.containers_to_kill.is_empty() && a.containers_to_start.is_empty());

        // Memory with RestartContainer: a memory change restarts it, a cpu
        // change alone does not.
        p.spec.as_mut().unwrap().containers[0].resize_policy = Some(vec![ContainerResizePolicy {
            resource_name: "memory".into(),
            restart_policy: "RestartContainer".into(),
        }]);
        let a = compute_pod_actions(&p, &rt(vec![sandbox(true)], vec![c.clone()]), &probes);
        assert_eq!(a.containers_to_update.len(), 1);
        p.spec.as_mut().unwrap().containers[0].resources = Some(limits("400m", "128Mi"));
        let a = compute_pod_actions(&p, &rt(vec![sandbox(true)], vec![c]), &probes);
        assert!(a.containers_to_update.is_empty());
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(
            a.containers_to_kill[0].reason,
            "Container app resize requires restart"
        );
    }

    fn debugger(p: &mut Pod, name: &str, target: Option<&str>) {
        let e = k8s_openapi::api::core::v1::EphemeralContainer {
            name: name.into(),
            image: Some("busybox:1.36".into()),
            target_container_name: target.map(String::from),
            ..Default::default()
        };
        let spec = p.spec.as_mut().unwrap();
        spec.ephemeral_containers
            .get_or_insert_with(Vec::new)
            .push(e);
    }

    #[test]
    fn ephemeral_containers_start_once_as_upstream() {
        // Old code never started an ephemeral container: `kubectl debug`
        // waited for good.
        let mut p = pod("Always", &["i1"], &["a"]);
        debugger(&mut p, "dbg", Some("a"));
        debugger(&mut p, "dbg2", None);
        // Not in a sandbox still to be made (upstream returns early there).
        let a = compute_pod_actions(&p, &RuntimePod::default(), &ProbeState::default());
        assert!(a.create_sandbox && a.ephemeral_to_start.is_empty());
        // Even while initialization runs.
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Running, 0, 2)],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert_eq!(a.ephemeral_to_start, vec![0, 1]);
        // Never restarted, whatever the policy.
        let mut dbg = ctr(&p, "a", CState::Exited, 1, 3);
        dbg.name = "dbg".into();
        dbg.id = "dbg-3".into();
        let r = rt(
            vec![sandbox(true)],
            vec![
                ctr(&p, "i1", CState::Exited, 0, 2),
                ctr(&p, "a", CState::Running, 0, 3),
                dbg,
            ],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert_eq!(a.ephemeral_to_start, vec![1]);
        // A deleted pod starts none.
        p.metadata.deletion_timestamp = Some(crate::testutil::epoch());
        assert!(compute_pod_actions(&p, &r, &ProbeState::default())
            .ephemeral_to_start
            .is_empty());
    }

    #[test]
    fn an_ephemeral_container_is_a_container_and_its_target() {
        let mut p = pod("Always", &[], &["a"]);
        debugger(&mut p, "dbg", Some("a"));
        debugger(&mut p, "dbg2", Some(""));
        let e = ephemeral_containers(&p);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0.name, "dbg");
        assert_eq!(e[0].0.image.as_deref(), Some("busybox:1.36"));
        assert_eq!(e[0].1.as_deref(), Some("a"));
        assert_eq!(e[1].1, None, "an empty target is none");
    }

    #[test]
    fn new_pod_creates_sandbox_and_starts_all_containers() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = compute_pod_actions(&p, &RuntimePod::default(), &ProbeState::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn new_pod_with_init_containers_starts_the_first_init_only() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = compute_pod_actions(&p, &RuntimePod::default(), &ProbeState::default());
        assert_eq!(a.init_to_start, vec![0]);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_then_apps() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Exited, 0, 2)],
        );
        assert_eq!(
            compute_pod_actions(&p, &r, &ProbeState::default()).init_to_start,
            vec![1]
        );
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Running, 0, 2)],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert_eq!((a.init_to_start.len(), a.containers_to_start.len()), (0, 0));
        let r = rt(
            vec![sandbox(true)],
            vec![
                ctr(&p, "i1", CState::Exited, 0, 2),
                ctr(&p, "i2", CState::Exited, 0, 3),
            ],
        );
        assert_eq!(
            compute_pod_actions(&p, &r, &ProbeState::default()).containers_to_start,
            vec![0]
        );
    }

    #[test]
    fn failed_init_container_is_retried_unless_policy_never() {
        let p = pod("Always", &["i1"], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Exited, 1, 2)],
        );
        assert_eq!(
            compute_pod_actions(&p, &r, &ProbeState::default()).init_to_start,
            vec![0]
        );
        let p = pod("Never", &["i1"], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Exited, 1, 2)],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert!(a.kill_pod && a.init_to_start.is_empty());
    }

    #[test]
    fn running_pod_with_unchanged_spec_needs_nothing() {
        let p = pod("Always", &[], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "a", CState::Running, 0, 2)],
        );
        assert_eq!(
            compute_pod_actions(&p, &r, &ProbeState::default()),
            PodActions {
                sandbox_id: Some("sb1".into()),
                ..Default::default()
            }
        );
    }

    #[test]
    fn changed_spec_kills_and_restarts_the_container() {
        let p = pod("Never", &[], &["a"]);
        let mut running = ctr(&p, "a", CState::Running, 0, 2);
        running.hash = Some("0".into());
        let a = compute_pod_actions(
            &p,
            &rt(vec![sandbox(true)], vec![running]),
            &ProbeState::default(),
        );
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill.len(), 1);
    }

    /// A container the upstream kubelet created carries only upstream's hash.
    /// Old behaviour: rkubelet never compared it, so an image change in the
    /// manifest left the old container running.
    #[test]
    fn a_container_from_upstream_is_adopted_or_replaced_by_upstreams_hash() {
        let p = pod("Always", &[], &["a"]);
        let mut running = ctr(&p, "a", CState::Running, 0, 2);
        running.hash = None;
        running.spec_version = None;
        let a = compute_pod_actions(
            &p,
            &rt(vec![sandbox(true)], vec![running.clone()]),
            &ProbeState::default(),
        );
        assert!(a.containers_to_start.is_empty() && a.containers_to_kill.is_empty());
        running.upstream_hash = Some("1".into());
        let a = compute_pod_actions(
            &p,
            &rt(vec![sandbox(true)], vec![running]),
            &ProbeState::default(),
        );
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill.len(), 1);
    }

    #[test]
    fn exited_containers_follow_the_restart_policy() {
        for (policy, code, restart) in [
            ("Always", 0, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 2, false),
        ] {
            let p = pod(policy, &[], &["a"]);
            let r = rt(
                vec![sandbox(true)],
                vec![ctr(&p, "a", CState::Exited, code, 2)],
            );
            let a = compute_pod_actions(&p, &r, &ProbeState::default());
            assert_eq!(
                !a.containers_to_start.is_empty(),
                restart,
                "{policy} exit {code}"
            );
            // Nothing left running and nothing to start: the sandbox goes.
            assert_eq!(a.kill_pod, !restart, "{policy} exit {code}");
        }
    }

    #[test]
    fn dead_sandbox_is_replaced_but_not_for_a_finished_never_pod() {
        let p = pod("Always", &[], &["a"]);
        let r = rt(
            vec![sandbox(false)],
            vec![ctr(&p, "a", CState::Exited, 137, 2)],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 1);
        let p = pod("Never", &[], &["a"]);
        let r = rt(
            vec![sandbox(false)],
            vec![ctr(&p, "a", CState::Exited, 0, 2)],
        );
        assert!(!compute_pod_actions(&p, &r, &ProbeState::default()).create_sandbox);
    }

    fn with_sidecar(p: &mut Pod, name: &str) {
        let inits = p
            .spec
            .as_mut()
            .unwrap()
            .init_containers
            .get_or_insert_with(Vec::new);
        inits.insert(
            0,
            Container {
                name: name.into(),
                image: Some("busybox".into()),
                restart_policy: Some("Always".into()),
                ..Default::default()
            },
        );
    }

    #[test]
    fn sidecar_starts_first_and_the_next_init_waits_for_its_startup() {
        let mut p = pod("Always", &["i1"], &["a"]);
        with_sidecar(&mut p, "side");
        let r = rt(vec![sandbox(true)], vec![]);
        assert_eq!(
            compute_pod_actions(&p, &r, &ProbeState::default()).init_to_start,
            vec![0]
        );
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "side", CState::Running, 0, 2)],
        );
        let waiting = ProbeState {
            not_started: ["side".to_string()].into(),
            ..Default::default()
        };
        assert!(compute_pod_actions(&p, &r, &waiting)
            .init_to_start
            .is_empty());
        assert_eq!(
            compute_pod_actions(&p, &r, &ProbeState::default()).init_to_start,
            vec![1]
        );
    }

    #[test]
    fn sidecar_is_restarted_beside_apps_but_not_after_they_finish() {
        let mut p = pod("Never", &[], &["a"]);
        with_sidecar(&mut p, "side");
        let r = rt(
            vec![sandbox(true)],
            vec![
                ctr(&p, "side", CState::Exited, 1, 2),
                ctr(&p, "a", CState::Running, 0, 3),
            ],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert_eq!(a.init_to_start, vec![0]);
        assert!(!a.kill_pod);
        let r = rt(
            vec![sandbox(true)],
            vec![
                ctr(&p, "side", CState::Running, 0, 2),
                ctr(&p, "a", CState::Exited, 0, 3),
            ],
        );
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert!(
            a.kill_pod,
            "the app finished: the sidecar goes with the pod"
        );
        assert!(a.init_to_start.is_empty());
    }

    #[test]
    fn liveness_failure_kills_and_restarts_unless_never() {
        let p = pod("Always", &[], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "a", CState::Running, 0, 2)],
        );
        let failed = ProbeState {
            failed: ["a".to_string()].into(),
            ..Default::default()
        };
        let a = compute_pod_actions(&p, &r, &failed);
        assert_eq!(
            (a.containers_to_kill.len(), a.containers_to_start.clone()),
            (1, vec![0])
        );
        let p = pod("Never", &[], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "a", CState::Running, 0, 2)],
        );
        let a = compute_pod_actions(&p, &r, &failed);
        assert_eq!(
            (a.containers_to_kill.len(), a.containers_to_start.len()),
            (1, 0)
        );
    }

    #[test]
    fn apps_start_when_the_latest_init_runs_succeeded_in_an_older_sandbox() {
        let p = pod("Always", &["i1"], &["a"]);
        let mut old_app = ctr(&p, "a", CState::Exited, 137, 3);
        old_app.sandbox_id = "old".into();
        let mut old_init = ctr(&p, "i1", CState::Exited, 0, 2);
        old_init.sandbox_id = "old".into();
        let r = rt(vec![sandbox(true)], vec![old_init, old_app]);
        // The latest init run belongs to an old sandbox but finished fine:
        // upstream reruns init only when the latest instance failed.
        let a = compute_pod_actions(&p, &r, &ProbeState::default());
        assert_eq!(a.containers_to_start, vec![0]);
    }
}
