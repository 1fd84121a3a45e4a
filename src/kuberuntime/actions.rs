//! computePodActions: compare a pod's spec with what the runtime runs and
//! decide what to kill, create and start (upstream
//! `kuberuntime_manager.go` computePodActions and its helpers). Pure: the
//! caller executes the actions.

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
    /// Index into `initContainers` of the one to start next.
    pub next_init: Option<usize>,
    /// Indexes into `containers` to start.
    pub containers_to_start: Vec<usize>,
    pub containers_to_kill: Vec<KillContainer>,
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

/// Upstream `findNextInitContainerToRun`: (last failed init status, next
/// init index to run, all done).
fn next_init_container<'a>(
    pod: &Pod,
    rt: &'a RuntimePod,
) -> (Option<&'a ContainerInfo>, Option<usize>, bool) {
    let inits = init_containers(pod);
    if inits.is_empty() {
        return (None, None, true);
    }
    // A running app container means initialization finished before.
    if app_containers(pod).iter().any(|c| {
        rt.latest(&c.name)
            .is_some_and(|s| s.state == CState::Running)
    }) {
        return (None, None, true);
    }
    for (i, c) in inits.iter().enumerate().rev() {
        if let Some(s) = rt.latest(&c.name) {
            if s.failed() {
                return (Some(s), Some(i), false);
            }
        }
    }
    for (i, c) in inits.iter().enumerate().rev() {
        let Some(s) = rt.latest(&c.name) else {
            continue;
        };
        match s.state {
            CState::Running => return (None, None, false),
            CState::Exited if i == inits.len() - 1 => return (None, None, true),
            CState::Exited => return (None, Some(i + 1), false),
            _ => {}
        }
    }
    (None, Some(0), false)
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

pub fn compute_pod_actions(pod: &Pod, rt: &RuntimePod) -> PodActions {
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
            a.next_init = Some(0);
            return a;
        }
        a.containers_to_start = to_start;
        return a;
    }

    let (last_failed, next, done) = next_init_container(pod, rt);
    if !done {
        if let Some(next) = next {
            if last_failed.is_some() && !should_restart_on_failure(pod) {
                a.kill_pod = true;
            } else {
                if let Some(s) = last_failed.filter(|s| s.state == CState::Unknown) {
                    a.containers_to_kill.push(KillContainer {
                        id: s.id.clone(),
                        name: s.name.clone(),
                        reason: "init container in unknown state".into(),
                    });
                }
                a.next_init = Some(next);
            }
        }
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
        if hash::spec_changed(c, s.hash.as_deref(), s.spec_version.as_deref()) {
            // A changed spec restarts the container whatever the policy.
            a.containers_to_start.push(idx);
            a.containers_to_kill.push(KillContainer {
                id: s.id.clone(),
                name: c.name.clone(),
                reason: format!("Container {} definition changed, will be restarted", c.name),
            });
            continue;
        }
        keep += 1;
    }
    if keep == 0 && a.containers_to_start.is_empty() {
        a.kill_pod = true;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::pod_status::SandboxInfo;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
        let c = |n: &&str| Container {
            name: n.to_string(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: Some(inits.iter().map(c).collect()),
                containers: apps.iter().map(c).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

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
            created_at: at,
            started_at: at,
            finished_at: at,
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
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

    #[test]
    fn new_pod_creates_sandbox_and_starts_all_containers() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = compute_pod_actions(&p, &RuntimePod::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn new_pod_with_init_containers_starts_the_first_init_only() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = compute_pod_actions(&p, &RuntimePod::default());
        assert_eq!(a.next_init, Some(0));
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_then_apps() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Exited, 0, 2)],
        );
        assert_eq!(compute_pod_actions(&p, &r).next_init, Some(1));
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Running, 0, 2)],
        );
        let a = compute_pod_actions(&p, &r);
        assert_eq!((a.next_init, a.containers_to_start.len()), (None, 0));
        let r = rt(
            vec![sandbox(true)],
            vec![
                ctr(&p, "i1", CState::Exited, 0, 2),
                ctr(&p, "i2", CState::Exited, 0, 3),
            ],
        );
        assert_eq!(compute_pod_actions(&p, &r).containers_to_start, vec![0]);
    }

    #[test]
    fn failed_init_container_is_retried_unless_policy_never() {
        let p = pod("Always", &["i1"], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Exited, 1, 2)],
        );
        assert_eq!(compute_pod_actions(&p, &r).next_init, Some(0));
        let p = pod("Never", &["i1"], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "i1", CState::Exited, 1, 2)],
        );
        let a = compute_pod_actions(&p, &r);
        assert!(a.kill_pod && a.next_init.is_none());
    }

    #[test]
    fn running_pod_with_unchanged_spec_needs_nothing() {
        let p = pod("Always", &[], &["a"]);
        let r = rt(
            vec![sandbox(true)],
            vec![ctr(&p, "a", CState::Running, 0, 2)],
        );
        assert_eq!(
            compute_pod_actions(&p, &r),
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
        let a = compute_pod_actions(&p, &rt(vec![sandbox(true)], vec![running]));
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
            let a = compute_pod_actions(&p, &r);
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
        let a = compute_pod_actions(&p, &r);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 1);
        let p = pod("Never", &[], &["a"]);
        let r = rt(
            vec![sandbox(false)],
            vec![ctr(&p, "a", CState::Exited, 0, 2)],
        );
        assert!(!compute_pod_actions(&p, &r).create_sandbox);
    }
}
