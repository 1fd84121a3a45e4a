//! Pod status as upstream computes it: container statuses with their states
//! and reasons, the phase (getPhase) and the pod conditions.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::cm;
use crate::kuberuntime::{CState, ContainerInfo, RuntimePod, Waiting};

pub struct StatusInput<'a> {
    pub pod: &'a Pod,
    pub rt: &'a RuntimePod,
    pub waiting: &'a HashMap<String, Waiting>,
    /// Readiness probe results by container name; a container with a
    /// readiness probe and no result yet is not ready, as upstream.
    pub readiness: &'a HashMap<String, bool>,
    /// Containers whose startup probe has not succeeded yet.
    pub not_started: &'a std::collections::HashSet<String>,
    pub host_ip: &'a str,
    pub previous: Option<&'a PodStatus>,
    pub now: Timestamp,
}

pub fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

fn time_ns(ns: i64) -> Option<Time> {
    // The API carries whole seconds (RFC 3339), as upstream's metav1.Time.
    (ns > 0)
        .then(|| Timestamp::from_second(ns / 1_000_000_000).ok().map(Time))
        .flatten()
}

fn terminated(c: &ContainerInfo) -> ContainerState {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(reason),
            message: Some(c.message.clone()).filter(|m| !m.is_empty()),
            started_at: time_ns(c.started_at),
            finished_at: time_ns(c.finished_at),
            container_id: Some(format!("containerd://{}", c.id)),
            signal: None,
        }),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: Some(message.to_string()).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

fn container_status(
    input: &StatusInput<'_>,
    c: &Container,
    default_reason: &str,
) -> ContainerStatus {
    let mut instances = input.rt.instances(&c.name);
    let latest = instances.next();
    let previous = instances.next();
    let mut s = ContainerStatus {
        name: c.name.clone(),
        image: crate::images::normalize_image(c.image.as_deref().unwrap_or_default()),
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        state: Some(waiting(default_reason, "")),
        ..Default::default()
    };
    if let Some(l) = latest {
        s.container_id = Some(format!("containerd://{}", l.id));
        s.image_id = l.image_ref.clone();
        s.restart_count = l.restart_count;
        match l.state {
            CState::Running => {
                s.state = Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: time_ns(l.started_at),
                    }),
                    ..Default::default()
                });
                let started = !input.not_started.contains(&c.name);
                s.started = Some(started);
                s.ready = started
                    && match c.readiness_probe {
                        None => true,
                        Some(_) => input.readiness.get(&c.name).copied().unwrap_or(false),
                    };
            }
            CState::Exited => s.state = Some(terminated(l)),
            CState::Created | CState::Unknown => s.state = Some(waiting("ContainerCreating", "")),
        }
        if let Some(p) = previous.filter(|p| p.state == CState::Exited) {
            s.last_state = Some(terminated(p));
        }
    }
    // A container the last sync could not (re)start waits with that reason,
    // and its last run becomes lastState.
    if let Some(w) = input.waiting.get(&c.name) {
        if latest.is_none_or(|l| l.state != CState::Running) {
            if let Some(l) = latest.filter(|l| l.state == CState::Exited) {
                s.last_state = Some(terminated(l));
            }
            s.state = Some(waiting(&w.reason, &w.message));
        }
    }
    s
}

fn state_of(s: &ContainerStatus) -> (bool, bool, Option<i32>) {
    let st = s.state.as_ref();
    let running = st.is_some_and(|x| x.running.is_some());
    let waiting = st.is_some_and(|x| x.waiting.is_some());
    let exit = st.and_then(|x| x.terminated.as_ref()).map(|t| t.exit_code);
    (running, waiting, exit)
}

fn last_exit(s: &ContainerStatus) -> Option<i32> {
    s.last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref())
        .map(|t| t.exit_code)
}

fn sidecar_names(pod: &Pod) -> Vec<&str> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| crate::kuberuntime::actions::is_sidecar(c))
        .map(|c| c.name.as_str())
        .collect()
}

/// Upstream getPhase.
pub fn phase(pod: &Pod, init: &[ContainerStatus], apps: &[ContainerStatus]) -> &'static str {
    let policy = crate::kuberuntime::actions::restart_policy(pod);
    let (mut pending_init, mut failed_init) = (false, false);
    let sidecars = sidecar_names(pod);
    for s in init {
        if sidecars.contains(&s.name.as_str()) {
            // A sidecar only holds the pod Pending until it first started;
            // its later exits and restarts do not change the phase.
            pending_init |= s.started != Some(true) && s.container_id.is_none();
            continue;
        }
        match state_of(s) {
            (true, _, _) => pending_init = true,
            (_, _, Some(code)) => failed_init |= code != 0,
            (_, true, _) => match last_exit(s) {
                Some(code) => failed_init |= code != 0,
                None => pending_init = true,
            },
            _ => pending_init = true,
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in apps {
        match state_of(s) {
            (true, _, _) => running += 1,
            (_, _, Some(code)) => {
                stopped += 1;
                if code == 0 {
                    succeeded += 1;
                }
            }
            (_, true, _) => {
                if last_exit(s).is_some() {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
            _ => waiting += 1,
        }
    }
    if failed_init && policy == "Never" {
        return "Failed";
    }
    if pending_init || failed_init {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        if policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == "Never" {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason.map(String::from) },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

pub fn generate_pod_status(input: &StatusInput<'_>) -> PodStatus {
    let pod = input.pod;
    let spec = pod.spec.as_ref();
    let inits = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let apps = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
    let default_reason = if inits.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let init_statuses: Vec<ContainerStatus> = inits
        .iter()
        .map(|c| container_status(input, c, "PodInitializing"))
        .collect();
    let app_statuses: Vec<ContainerStatus> = apps
        .iter()
        .map(|c| container_status(input, c, default_reason))
        .collect();
    let phase = phase(pod, &init_statuses, &app_statuses);

    let host_net = spec.and_then(|s| s.host_network).unwrap_or(false);
    let mut ips = if host_net && !input.host_ip.is_empty() {
        vec![input.host_ip.to_string()]
    } else {
        input.rt.ips()
    };
    if ips.is_empty() {
        // A finished pod keeps the IP it had (upstream keeps the old podIPs).
        ips = input
            .previous
            .and_then(|p| p.pod_ips.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.ip)
            .collect();
    }

    let sandbox_ready = input
        .rt
        .sandboxes
        .first()
        .is_some_and(|s| s.ready && (s.host_network || !s.ips.is_empty()));
    let sidecars = sidecar_names(pod);
    let not_init: Vec<&str> = init_statuses
        .iter()
        .filter(|s| {
            if sidecars.contains(&s.name.as_str()) {
                s.started != Some(true)
            } else {
                state_of(s).2 != Some(0)
            }
        })
        .map(|s| s.name.as_str())
        .collect();
    let apps_started = app_statuses.iter().any(|s| s.container_id.is_some());
    let initialized = not_init.is_empty() || apps_started;
    let unready: Vec<&str> = app_statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let completed = phase == "Succeeded";
    let ready_reason = if completed {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let unready_msg =
        (!completed).then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None),
        condition(
            "Initialized",
            initialized,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                not_init.join(" ")
            )),
        ),
        condition(
            "Ready",
            unready.is_empty() && !completed,
            Some(ready_reason),
            unready_msg.clone(),
        ),
        condition(
            "ContainersReady",
            unready.is_empty() && !completed,
            Some(ready_reason),
            unready_msg,
        ),
        condition("PodScheduled", true, None, None),
    ];
    if completed && initialized {
        for c in conditions.iter_mut().filter(|c| c.type_ == "Initialized") {
            c.reason = Some("PodCompleted".into());
        }
    }
    let now = Time(input.now);
    for c in &mut conditions {
        let prev = input
            .previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|p| p.type_ == c.type_));
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
        c.last_probe_time = None;
    }

    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: Some(input.host_ip.to_string()).filter(|h| !h.is_empty()),
        host_ips: Some(vec![HostIP {
            ip: input.host_ip.to_string(),
        }])
        .filter(|_| !input.host_ip.is_empty()),
        pod_ip: ips.first().cloned(),
        pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect())
            .filter(|v: &Vec<PodIP>| !v.is_empty()),
        start_time: input
            .previous
            .and_then(|p| p.start_time.clone())
            .or(Some(now)),
        qos_class: Some(cm::pod_qos(pod).as_str().into()),
        container_statuses: Some(app_statuses),
        init_container_statuses: Some(init_statuses).filter(|v| !v.is_empty()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::SandboxInfo;

    use crate::testutil::pod;

    fn info(name: &str, state: CState, exit: i32, at: i64, restarts: i32) -> ContainerInfo {
        ContainerInfo {
            id: format!("{name}{at}"),
            name: name.into(),
            sandbox_id: "sb".into(),
            state,
            init: false,
            restart_count: restarts,
            hash: None,
            spec_version: None,
            created_at: at,
            started_at: at * 1_000_000_000,
            finished_at: (at + 1) * 1_000_000_000,
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: "sha256:x".into(),
            pod_grace: None,
            pre_stop: None,
        }
    }

    fn rt(cs: Vec<ContainerInfo>) -> RuntimePod {
        let mut r = RuntimePod {
            uid: "u".into(),
            sandboxes: vec![SandboxInfo {
                id: "sb".into(),
                ready: true,
                attempt: 0,
                created_at: 0,
                ips: vec!["10.88.0.9".into()],
                host_network: false,
            }],
            containers: cs,
        };
        r.sort();
        r
    }

    fn gen(p: &Pod, r: &RuntimePod, waiting: &HashMap<String, Waiting>) -> PodStatus {
        let empty = HashMap::new();
        generate_pod_status(&StatusInput {
            pod: p,
            rt: r,
            waiting,
            readiness: &empty,
            not_started: &Default::default(),
            host_ip: "192.0.2.1",
            previous: None,
            now: Timestamp::UNIX_EPOCH,
        })
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    #[test]
    fn new_pod_is_pending_with_container_creating() {
        let p = pod("Always", &[], &["a"]);
        let s = gen(&p, &RuntimePod::default(), &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let w = s.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
    }

    #[test]
    fn running_pod_is_ready_with_ip_and_qos() {
        let p = pod("Always", &[], &["a"]);
        let s = gen(
            &p,
            &rt(vec![info("a", CState::Running, 0, 5, 0)]),
            &HashMap::new(),
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.9"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(cond(&s, "Ready").status, "True");
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert!(cs.ready && cs.container_id.as_deref() == Some("containerd://a5"));
    }

    #[test]
    fn crash_loop_shows_waiting_reason_last_state_and_stays_running() {
        let p = pod("Always", &[], &["a"]);
        let r = rt(vec![info("a", CState::Exited, 1, 7, 3)]);
        let w = HashMap::from([(
            "a".to_string(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 40s".into(),
            },
        )]);
        let s = gen(&p, &r, &w);
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("CrashLoopBackOff")
        );
        assert_eq!(
            cs.last_state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("Error")
        );
        assert_eq!(cs.restart_count, 3);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").status, "False");
    }

    #[test]
    fn finished_pods_end_succeeded_or_failed_by_policy() {
        let ok = rt(vec![info("a", CState::Exited, 0, 7, 0)]);
        let bad = rt(vec![info("a", CState::Exited, 2, 7, 0)]);
        assert_eq!(
            gen(&pod("Never", &[], &["a"]), &ok, &HashMap::new())
                .phase
                .as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            gen(&pod("OnFailure", &[], &["a"]), &ok, &HashMap::new())
                .phase
                .as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            gen(&pod("Never", &[], &["a"]), &bad, &HashMap::new())
                .phase
                .as_deref(),
            Some("Failed")
        );
        let s = gen(&pod("Never", &[], &["a"]), &ok, &HashMap::new());
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
    }

    #[test]
    fn init_containers_gate_initialized_and_phase() {
        let p = pod("Always", &["i"], &["a"]);
        let s = gen(
            &p,
            &rt(vec![info("i", CState::Running, 0, 3, 0)]),
            &HashMap::new(),
        );
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&s, "Initialized").status, "False");
        let a = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            a.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("PodInitializing")
        );
        let s = gen(
            &p,
            &rt(vec![
                info("i", CState::Exited, 0, 3, 0),
                info("a", CState::Running, 0, 5, 0),
            ]),
            &HashMap::new(),
        );
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(s.phase.as_deref(), Some("Running"));
        let never = pod("Never", &["i"], &["a"]);
        assert_eq!(
            gen(
                &never,
                &rt(vec![info("i", CState::Exited, 1, 3, 0)]),
                &HashMap::new()
            )
            .phase
            .as_deref(),
            Some("Failed")
        );
    }

    #[test]
    fn a_readiness_probe_without_result_keeps_the_container_unready() {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().containers[0].readiness_probe = Some(Default::default());
        let s = gen(
            &p,
            &rt(vec![info("a", CState::Running, 0, 5, 0)]),
            &HashMap::new(),
        );
        assert!(!s.container_statuses.unwrap()[0].ready);
    }

    #[test]
    fn a_running_sidecar_neither_blocks_nor_prolongs_the_phase() {
        let mut p = pod("Never", &["side"], &["a"]);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
            Some("Always".into());
        let s = gen(
            &p,
            &rt(vec![
                info("side", CState::Running, 0, 2, 0),
                info("a", CState::Running, 0, 3, 0),
            ]),
            &HashMap::new(),
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized").status, "True");
        // The app finished; the sidecar was stopped with exit 137 afterwards.
        let s = gen(
            &p,
            &rt(vec![
                info("side", CState::Exited, 137, 5, 0),
                info("a", CState::Exited, 0, 3, 0),
            ]),
            &HashMap::new(),
        );
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    }
}
