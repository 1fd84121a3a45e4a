//! Pod status as upstream computes it (`kubelet_pods.go`
//! generateAPIPodStatus, convertToAPIContainerStatuses, getPhase; the probe
//! manager's UpdatePodStatus; `status/generate.go` for the conditions).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::cm;
use crate::kuberuntime::actions::is_sidecar;
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
    /// True only once the pod worker has finished terminating the pod
    /// (upstream's podIsTerminal). Until then a pod whose containers all
    /// stopped keeps the phase its restart policy gives (an Always pod stays
    /// Running); afterwards a non-static pod is Succeeded or Failed.
    pub pod_is_terminal: bool,
    /// The PodObservedGenerationTracking gate (beta, on by default in 1.34).
    pub track_generation: bool,
    /// Where the pod's in-place resize stands.
    pub resize: ResizeStatus,
}

/// An in-place resize, as the pod's conditions show it.
#[derive(Debug, Clone, Default)]
pub struct ResizeStatus {
    /// Waiting for room (PodResizePending: Infeasible or Deferred).
    pub pending: Option<crate::allocation::Pending>,
    /// Granted and not yet applied (PodResizeInProgress).
    pub in_progress: bool,
    /// Why applying it failed (PodResizeInProgress with reason Error).
    pub error: Option<String>,
}

pub fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Upstream's message for a container that vanished from the runtime while
/// its last status was running and the runtime still lists it (state
/// unknown).
pub const MSG_NOT_LOCATED_TERMINATED: &str =
    "The container could not be located when the pod was terminated";
/// The same, for a container the runtime no longer lists at all.
pub const MSG_NOT_LOCATED_DELETED: &str =
    "The container could not be located when the pod was deleted.  The container used to be Running";
pub const REASON_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Upstream kubetypes.IsStaticPod: any config source but the API server.
fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::source::CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s != "api")
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
            container_id: Some(container_id(&c.id)),
            signal: None,
        }),
        ..Default::default()
    }
}

fn lost(message: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 137,
            reason: Some(REASON_STATUS_UNKNOWN.into()),
            message: Some(message.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()).filter(|r| !r.is_empty()),
            message: Some(message.to_string()).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

fn is_running(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.running.is_some())
}

fn is_stopped(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.terminated.is_some())
}

/// The runtime's name as CRI Version gives it: the scheme of every
/// containerID (upstream's ContainerID.Type), `cri-o://…` on CRI-O.
static RUNTIME_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the runtime's name, once, from its first Version answer.
pub fn set_runtime_name(name: &str) {
    if !name.is_empty() {
        let _ = RUNTIME_NAME.set(name.to_string());
    }
}

/// `<runtime>://<id>`; containerd's scheme until the runtime has answered.
fn container_id(id: &str) -> String {
    scheme_id(RUNTIME_NAME.get().map_or("containerd", String::as_str), id)
}

fn scheme_id(runtime: &str, id: &str) -> String {
    format!("{runtime}://{id}")
}

/// One runtime instance as the API shows it (upstream convertContainerStatus).
fn convert(c: &Container, l: &ContainerInfo, old: Option<&ContainerStatus>) -> ContainerStatus {
    let mut s = ContainerStatus {
        name: c.name.clone(),
        image: crate::images::normalize_image(c.image.as_deref().unwrap_or_default()),
        image_id: l.image_ref.clone(),
        container_id: Some(container_id(&l.id)),
        restart_count: l.restart_count,
        ..Default::default()
    };
    s.state = Some(match l.state {
        CState::Running => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time_ns(l.started_at),
            }),
            ..Default::default()
        },
        CState::Exited => terminated(l),
        // Ran before and now cannot be read: it ran and stopped, which must
        // not look like "never ran" (a Never pod would run it twice).
        CState::Unknown if is_running(old.and_then(|o| o.state.as_ref())) => {
            s.restart_count = old.map_or(0, |o| o.restart_count) + 1;
            lost(MSG_NOT_LOCATED_TERMINATED)
        }
        // Created but not started: waiting, with no reason of its own.
        CState::Created | CState::Unknown => waiting("", ""),
    });
    s
}

fn container_status(
    input: &StatusInput<'_>,
    c: &Container,
    init: bool,
    default_reason: &str,
    previous: &[ContainerStatus],
) -> ContainerStatus {
    let old = previous.iter().find(|s| s.name == c.name);
    let mut s = ContainerStatus {
        name: c.name.clone(),
        image: crate::images::normalize_image(c.image.as_deref().unwrap_or_default()),
        state: Some(waiting(default_reason, "")),
        ..Default::default()
    };
    // The previous status is the default: a terminated one stays as it was,
    // otherwise its restart count and last state carry over.
    if let Some(o) = old {
        if is_stopped(o.state.as_ref()) {
            s = o.clone();
        } else {
            s.restart_count = o.restart_count;
            s.last_state = o.last_state.clone();
        }
    }
    let mut instances = input.rt.instances(&c.name);
    let latest = instances.next();
    match latest {
        Some(l) => {
            s = convert(c, l, old);
            if let Some(p) = instances.next() {
                s.last_state = convert(c, p, None).state;
            }
        }
        None => {
            // Was running and vanished from the runtime: it stopped, even if
            // how is unknown; without this the pod would fall back to Pending.
            let defaulted = s
                .state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
            let no_last = s.last_state.as_ref().is_none_or(|l| l.terminated.is_none());
            if is_running(old.and_then(|o| o.state.as_ref())) && defaulted && no_last {
                s.last_state = Some(lost(MSG_NOT_LOCATED_DELETED));
                if input.pod.metadata.deletion_timestamp.is_none() {
                    s.restart_count += 1;
                }
            }
        }
    }
    // A container the last sync could not (re)start waits with that reason,
    // and its last run becomes lastState. An init container that succeeded
    // is never restarted, so it keeps its state.
    let init_done = init
        && !is_sidecar(c)
        && latest.is_some_and(|l| l.state == CState::Exited && l.exit_code == 0);
    if let Some(w) = input.waiting.get(&c.name).filter(|_| !init_done) {
        if latest.is_none_or(|l| l.state != CState::Running) {
            if is_stopped(s.state.as_ref()) {
                s.last_state = s.state.take();
            }
            s.state = Some(waiting(&w.reason, &w.message));
        }
    }
    // In-place resize (upstream convertToAPIContainerStatuses): what was
    // granted, and what the runtime applied, for every container that ran.
    if let Some(l) = latest {
        s.allocated_resources = c.resources.as_ref().and_then(|r| r.requests.clone());
        s.resources = Some(applied_resources(c, l));
        // SupplementalGroupsPolicy (beta, on): who the process runs as, as
        // the runtime reports it (convertContainerStatusUser).
        s.user =
            l.user
                .as_ref()
                .map(|u| k8s_openapi::api::core::v1::ContainerUser {
                    linux: u.linux.as_ref().map(|l| {
                        k8s_openapi::api::core::v1::LinuxContainerUser {
                            uid: l.uid,
                            gid: l.gid,
                            supplemental_groups: (!l.supplemental_groups.is_empty())
                                .then(|| l.supplemental_groups.clone()),
                        }
                    }),
                });
    }
    // Upstream's probe manager: started and ready.
    let running = is_running(s.state.as_ref());
    let started = running && !input.not_started.contains(&c.name);
    s.started = Some(started);
    s.ready = if init && !is_sidecar(c) {
        // A regular init container is ready once it exited 0.
        s.state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    } else {
        started
            && match c.readiness_probe {
                None => true,
                Some(_) => input.readiness.get(&c.name).copied().unwrap_or(false),
            }
    };
    s
}

/// A container's resources as the runtime applied them (upstream
/// convertContainerStatusResources): the granted ones, with the cpu request
/// (from shares), cpu limit (from quota over period) and memory limit the
/// runtime reports for a running container where they differ from what the
/// grant gives (mid-resize).
fn applied_resources(c: &Container, l: &ContainerInfo) -> ResourceRequirements {
    let mut r = c.resources.clone().unwrap_or_default();
    let Some(have) = l.resources.as_ref().filter(|_| l.state == CState::Running) else {
        return r;
    };
    let want = cm::container_resources(c);
    let mut set = |limits: bool, name: &str, q: Quantity| {
        let m = if limits {
            &mut r.limits
        } else {
            &mut r.requests
        };
        m.get_or_insert_with(Default::default)
            .insert(name.into(), q);
    };
    if have.cpu_shares > 0 && have.cpu_shares != cm::cpu_shares(want.cpu_request) {
        // Upstream's sharesToMilliCPU rounds up.
        let milli = (have.cpu_shares * 1000 + 1023) / 1024;
        set(false, "cpu", cpu_quantity(milli));
    }
    if have.cpu_quota > 0 && have.cpu_period > 0 && have.cpu_quota != cm::cpu_quota(want.cpu_limit)
    {
        set(
            true,
            "cpu",
            cpu_quantity(have.cpu_quota * 1000 / have.cpu_period),
        );
    }
    if have.memory_limit_in_bytes > 0 && Some(have.memory_limit_in_bytes) != want.mem_limit {
        set(true, "memory", bytes_quantity(have.memory_limit_in_bytes));
    }
    r
}

/// Millicores as the API's canonical quantity ("1", "250m").
fn cpu_quantity(milli: i64) -> Quantity {
    Quantity(if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    })
}

/// Bytes as the API's canonical binary quantity ("64Mi", "1000").
fn bytes_quantity(bytes: i64) -> Quantity {
    let mut n = bytes;
    let mut suffix = "";
    for s in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"] {
        if n == 0 || n % 1024 != 0 {
            break;
        }
        n /= 1024;
        suffix = s;
    }
    Quantity(format!("{n}{suffix}"))
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

fn find<'a>(list: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    list.iter().find(|s| s.name == name)
}

/// Upstream getPhase (without the alpha ContainerRestartRules).
/// `has_initialized` is upstream's HasAnyActiveRegularContainerStarted: a
/// regular container exists in the current sandbox.
pub fn phase(
    pod: &Pod,
    init: &[ContainerStatus],
    apps: &[ContainerStatus],
    pod_is_terminal: bool,
    has_initialized: bool,
) -> &'static str {
    let policy = crate::kuberuntime::actions::restart_policy(pod);
    let spec = pod.spec.as_ref();
    let (mut pending_regular_init, mut pending_sidecar, mut failed_init) = (0, 0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in spec.iter().flat_map(|s| s.init_containers.iter().flatten()) {
        let Some(s) = find(init, &c.name) else {
            if is_sidecar(c) {
                unknown += 1;
            } else {
                pending_regular_init += 1;
            }
            continue;
        };
        let (run, wait, exit) = state_of(s);
        if is_sidecar(c) {
            // A sidecar that ran counts while running; its exits and
            // restarts never change the phase.
            if run {
                if s.started != Some(true) {
                    pending_sidecar += 1;
                }
                running += 1;
            } else if exit.is_some() {
                // A stopped sidecar does not count towards the phase.
            } else if wait {
                if last_exit(s).is_none() {
                    pending_sidecar += 1;
                    waiting += 1;
                }
            } else {
                pending_sidecar += 1;
                unknown += 1;
            }
            continue;
        }
        match (run, wait, exit) {
            (true, _, _) => pending_regular_init += 1,
            (_, _, Some(code)) => failed_init += (code != 0) as i32,
            (_, true, _) => match last_exit(s) {
                Some(code) => failed_init += (code != 0) as i32,
                None => pending_regular_init += 1,
            },
            _ => pending_regular_init += 1,
        }
    }
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or(&[]) {
        let Some(s) = find(apps, &c.name) else {
            unknown += 1;
            continue;
        };
        match state_of(s) {
            (true, _, _) => running += 1,
            (_, _, Some(code)) => {
                stopped += 1;
                succeeded += (code == 0) as i32;
            }
            (_, true, _) => {
                if last_exit(s).is_some() {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
            _ => unknown += 1,
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_regular_init > 0 || (pending_sidecar > 0 && !has_initialized) || waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        // Terminated by the worker: nothing restarts, whatever the policy.
        // Static pods are left out upstream (TODO k/k #116484).
        if pod_is_terminal && !is_static(pod) {
            return if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            };
        }
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

fn cond(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.map(String::from),
        message,
        ..Default::default()
    }
}

/// Go's `fmt.Sprintf("%s", []string)`: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// Upstream GenerateContainersReadyCondition: sidecars and regular
/// containers; a terminal pod is not ready, with the phase as the reason.
fn containers_ready(
    pod: &Pod,
    inits: &[ContainerStatus],
    apps: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let spec = pod.spec.as_ref();
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| is_sidecar(c))
        .map(|c| (c, inits));
    let regular = spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c, apps));
    for (c, list) in sidecars.chain(regular) {
        match list.iter().find(|s| s.name == c.name) {
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
            None => unknown.push(c.name.as_str()),
        }
    }
    const T: &str = "ContainersReady";
    if phase == "Succeeded" && unknown.is_empty() {
        return cond(T, false, Some("PodCompleted"), None);
    }
    if phase == "Failed" {
        return cond(T, false, Some("PodFailed"), None);
    }
    let msgs = not_ready_messages(&unknown, "unready", &unready);
    if msgs.is_empty() {
        cond(T, true, None, None)
    } else {
        cond(T, false, Some("ContainersNotReady"), Some(msgs.join(", ")))
    }
}

/// Upstream's "containers with unknown status: [a]" and "containers with
/// <other> status: [b]" parts of a not-ready condition's message.
fn not_ready_messages(unknown: &[&str], other: &str, names: &[&str]) -> Vec<String> {
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(unknown)
        ));
    }
    if !names.is_empty() {
        msgs.push(format!(
            "containers with {other} status: {}",
            go_list(names)
        ));
    }
    msgs
}

/// Upstream GeneratePodReadyCondition: ContainersReady, then readiness gates.
fn pod_ready(pod: &Pod, containers_ready: &PodCondition) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers_ready.clone()
        };
    }
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or(&[]);
    let msgs: Vec<String> = gates
        .iter()
        .filter_map(
            |g| match conditions.iter().find(|c| c.type_ == g.condition_type) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {:?} does not exist.",
                    g.condition_type
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {:?} is not \"True\", but {}",
                    g.condition_type, c.status
                )),
                Some(_) => None,
            },
        )
        .collect();
    if msgs.is_empty() {
        cond("Ready", true, None, None)
    } else {
        cond(
            "Ready",
            false,
            Some("ReadinessGatesNotReady"),
            Some(msgs.join(", ")),
        )
    }
}

/// The condition of type `t` in `status`.
fn condition<'a>(status: Option<&'a PodStatus>, t: &str) -> Option<&'a PodCondition> {
    status?.conditions.as_ref()?.iter().find(|c| c.type_ == t)
}

/// Upstream PodConditionByKubelet, PodReadyToStartContainersCondition on
/// (beta, on by default): the conditions the kubelet writes. Others (a
/// readiness gate's, DisruptionTarget) belong to whoever set them.
pub fn is_kubelet_condition(type_: &str) -> bool {
    matches!(
        type_,
        "PodScheduled"
            | "Ready"
            | "Initialized"
            | "ContainersReady"
            | "PodResizeInProgress"
            | "PodResizePending"
            | "PodReadyToStartContainers"
    )
}

/// As generateAPIPodStatus: the conditions others set on the pod (as the
/// source last showed it) come first, a DisruptionTarget (upstream's one
/// condition shared with the kubelet) set earlier is kept, then the
/// kubelet's own.
fn with_foreign_conditions(
    pod: &Pod,
    previous: Option<&PodStatus>,
    own: Vec<PodCondition>,
) -> Vec<PodCondition> {
    let mut out: Vec<PodCondition> = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| !is_kubelet_condition(&c.type_))
        .cloned()
        .collect();
    if let Some(d) = condition(previous, "DisruptionTarget") {
        match out.iter_mut().find(|c| c.type_ == d.type_) {
            Some(slot) => *slot = d.clone(),
            None => out.push(d.clone()),
        }
    }
    out.extend(own);
    out
}

/// Upstream NeedToReconcilePodReadiness: a pod with readiness gates whose
/// Ready condition, as its source shows it, is not what the conditions and
/// container statuses it shows give (a gate's condition changed).
pub fn readiness_needs_reconcile(pod: &Pod) -> bool {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let Some(status) = pod.status.as_ref().filter(|_| gated) else {
        return false;
    };
    let Some(current) = condition(Some(status), "Ready") else {
        return false;
    };
    let containers = containers_ready(
        pod,
        status.init_container_statuses.as_deref().unwrap_or(&[]),
        status.container_statuses.as_deref().unwrap_or(&[]),
        status.phase.as_deref().unwrap_or_default(),
    );
    let expected = pod_ready(pod, &containers);
    // Go compares strings: no message is the empty one.
    current.status != expected.status
        || current.message.as_deref().unwrap_or_default()
            != expected.message.as_deref().unwrap_or_default()
}

/// Upstream GeneratePodInitializedCondition.
fn initialized(
    pod: &Pod,
    inits: &[ContainerStatus],
    apps: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
    {
        let Some(s) = inits.iter().find(|s| s.name == c.name) else {
            unknown.push(c.name.as_str());
            continue;
        };
        let done = if is_sidecar(c) {
            s.started == Some(true)
        } else {
            s.ready
        };
        if !done {
            incomplete.push(c.name.as_str());
        }
    }
    const T: &str = "Initialized";
    if phase == "Succeeded" && unknown.is_empty() {
        return cond(T, true, Some("PodCompleted"), None);
    }
    // A regular container that ran means the pod was initialized, even while
    // a sidecar restarts (upstream HasAnyRegularContainerStarted).
    if apps
        .iter()
        .any(|s| is_running(s.state.as_ref()) || is_stopped(s.state.as_ref()))
    {
        return cond(T, true, None, None);
    }
    let msgs = not_ready_messages(&unknown, "incomplete", &incomplete);
    if msgs.is_empty() {
        cond(T, true, None, None)
    } else {
        cond(
            T,
            false,
            Some("ContainersNotInitialized"),
            Some(msgs.join(", ")),
        )
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
    let prev_init = input
        .previous
        .and_then(|p| p.init_container_statuses.as_deref())
        .unwrap_or(&[]);
    let prev_apps = input
        .previous
        .and_then(|p| p.container_statuses.as_deref())
        .unwrap_or(&[]);
    let init_statuses: Vec<ContainerStatus> = inits
        .iter()
        .map(|c| container_status(input, c, true, "PodInitializing", prev_init))
        .collect();
    let app_statuses: Vec<ContainerStatus> = apps
        .iter()
        .map(|c| container_status(input, c, false, default_reason, prev_apps))
        .collect();
    let prev_ephemeral = input
        .previous
        .and_then(|p| p.ephemeral_container_statuses.as_deref())
        .unwrap_or(&[]);
    // Upstream converts them as regular containers; the probe manager never
    // marks them ready or started, and they weigh on no phase or condition.
    let ephemeral_statuses: Vec<ContainerStatus> =
        crate::kuberuntime::actions::ephemeral_containers(pod)
            .iter()
            .map(|(c, _)| ContainerStatus {
                ready: false,
                started: None,
                ..container_status(input, c, false, default_reason, prev_ephemeral)
            })
            .collect();
    // Upstream HasAnyActiveRegularContainerStarted: a regular container in
    // the newest sandbox.
    let current_sandbox = input.rt.sandboxes.first().map(|s| s.id.as_str());
    let has_initialized = apps.iter().any(|c| {
        input
            .rt
            .instances(&c.name)
            .any(|i| Some(i.sandbox_id.as_str()) == current_sandbox)
    });
    let mut phase = phase(
        pod,
        &init_statuses,
        &app_statuses,
        input.pod_is_terminal,
        has_initialized,
    );

    // Terminal-phase guard: a terminal phase, once reported (by rkubelet or
    // in the API object), is kept, with its reason and message.
    let old_phase = input.previous.and_then(|p| p.phase.as_deref());
    let api_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !is_terminal(Some(phase)) {
        // Upstream looks at the status manager's copy first, then the API's.
        match [old_phase, api_phase]
            .into_iter()
            .flatten()
            .find(|p| is_terminal(Some(p)))
        {
            Some("Succeeded") => phase = "Succeeded",
            Some(_) => phase = "Failed",
            None => {}
        }
    }
    let (mut reason, mut message) = (None, None);
    if Some(phase) == old_phase {
        reason = input.previous.and_then(|p| p.reason.clone());
        message = input.previous.and_then(|p| p.message.clone());
        let api = pod.status.as_ref();
        if reason.as_deref().is_none_or(str::is_empty) {
            reason = api.and_then(|s| s.reason.clone());
        }
        if message.as_deref().is_none_or(str::is_empty) {
            message = api.and_then(|s| s.message.clone());
        }
    }

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
    let containers_ready = containers_ready(pod, &init_statuses, &app_statuses, phase);
    // The resize conditions come before the kubelet's others, and not for
    // a pod that finished (upstream determinePodResizeStatus).
    let mut conditions = Vec::new();
    if !is_terminal(Some(phase)) {
        if let Some(p) = &input.resize.pending {
            conditions.push(cond(
                "PodResizePending",
                true,
                Some(p.reason),
                Some(p.message.clone()),
            ));
        }
        if input.resize.in_progress || input.resize.error.is_some() {
            let reason = input.resize.error.as_ref().map(|_| "Error");
            conditions.push(cond(
                "PodResizeInProgress",
                true,
                reason,
                input.resize.error.clone(),
            ));
        }
    }
    conditions.extend([
        cond("PodReadyToStartContainers", sandbox_ready, None, None),
        initialized(pod, &init_statuses, &app_statuses, phase),
        pod_ready(pod, &containers_ready),
        containers_ready,
        cond("PodScheduled", true, None, None),
    ]);
    let now = Time(input.now);
    // observedGeneration as upstream's CalculatePod(Condition|Status)-
    // ObservedGeneration: the gate, or a value already held (never cleared
    // once set). Upstream's oldPodStatus is the status manager's copy, else
    // the API's.
    let generation = pod.metadata.generation.unwrap_or(0);
    let observed = |held: Option<i64>| {
        Some(generation).filter(|g| *g != 0 && (input.track_generation || held.unwrap_or(0) != 0))
    };
    let old_status = input.previous.or(pod.status.as_ref());
    for c in &mut conditions {
        // A resize condition moves when its reason does (upstream
        // updatedPodResizeCondition).
        let resize = c.type_.starts_with("PodResize");
        c.last_transition_time = match condition(input.previous, &c.type_) {
            Some(p) if p.status == c.status && (!resize || p.reason == c.reason) => {
                p.last_transition_time.clone()
            }
            _ => Some(now.clone()),
        };
        c.last_probe_time = None;
        c.observed_generation =
            observed(condition(old_status, &c.type_).and_then(|o| o.observed_generation));
    }
    let observed_generation = observed(pod.status.as_ref().and_then(|s| s.observed_generation));
    let conditions = with_foreign_conditions(pod, input.previous, conditions);

    PodStatus {
        phase: Some(phase.into()),
        observed_generation,
        reason,
        message,
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
        ephemeral_container_statuses: Some(ephemeral_statuses).filter(|v| !v.is_empty()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::SandboxInfo;

    use crate::testutil::pod;

    /// The containerID's scheme is the runtime's name (upstream's
    /// ContainerID.Type): CRI-O's containers are `cri-o://…`; it was always
    /// `containerd://`. (The process-wide name is not set here, so the
    /// other tests keep containerd's.)
    #[test]
    fn container_ids_carry_the_runtimes_name() {
        assert_eq!(scheme_id("cri-o", "abc"), "cri-o://abc");
        assert_eq!(container_id("abc"), "containerd://abc");
    }

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
            upstream_hash: None,
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
            resources: None,
            user: None,
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
        gen_with(p, r, waiting, None, false)
    }

    fn gen_with(
        p: &Pod,
        r: &RuntimePod,
        waiting: &HashMap<String, Waiting>,
        previous: Option<&PodStatus>,
        pod_is_terminal: bool,
    ) -> PodStatus {
        let empty = HashMap::new();
        generate_pod_status(&StatusInput {
            pod: p,
            rt: r,
            waiting,
            readiness: &empty,
            not_started: &Default::default(),
            host_ip: "192.0.2.1",
            previous,
            now: Timestamp::UNIX_EPOCH,
            pod_is_terminal,
            track_generation: true,
            resize: Default::default(),
        })
    }

    fn sidecar_pod(policy: &str) -> Pod {
        let mut p = pod(policy, &["side"], &["a"]);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
            Some("Always".into());
        p
    }

    fn app(s: &PodStatus) -> &ContainerStatus {
        &s.container_statuses.as_ref().unwrap()[0]
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    fn gated(gate_status: Option<&str>) -> Pod {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().readiness_gates =
            Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
                condition_type: "example.com/lb".into(),
            }]);
        let mut conditions = vec![PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }];
        if let Some(st) = gate_status {
            conditions.push(PodCondition {
                type_: "example.com/lb".into(),
                status: st.into(),
                ..Default::default()
            });
        }
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(conditions),
            ..Default::default()
        });
        p
    }

    #[test]
    fn a_resize_shows_in_conditions_and_container_resources_as_upstream() {
        // Old code: no resize conditions, and container statuses had no
        // allocatedResources or resources.
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let mut p = pod("Always", &[], &["a"]);
        let q = |cpu: &str, mem: &str| {
            Some(
                [
                    ("cpu".to_string(), Quantity(cpu.into())),
                    ("memory".to_string(), Quantity(mem.into())),
                ]
                .into(),
            )
        };
        // Granted: 500m/1, 64Mi limit.
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: q("500m", "32Mi"),
            limits: q("1", "64Mi"),
            ..Default::default()
        });
        // The runtime still runs the old 250m/500m and 32Mi limit.
        let mut c = info("a", CState::Running, 0, 5, 0);
        c.resources = Some(crate::cri::v1::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 256,
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        });
        // Who the process runs as, as the runtime reports it (old code:
        // containerStatuses[].user was never set).
        c.user = Some(crate::cri::v1::ContainerUser {
            linux: Some(crate::cri::v1::LinuxContainerUser {
                uid: 1000,
                gid: 3000,
                supplemental_groups: vec![3000, 4000],
            }),
        });
        let r = rt(vec![c]);
        let s = generate_pod_status(&StatusInput {
            pod: &p,
            rt: &r,
            waiting: &HashMap::new(),
            readiness: &HashMap::new(),
            not_started: &Default::default(),
            host_ip: "192.0.2.1",
            previous: None,
            now: Timestamp::UNIX_EPOCH,
            pod_is_terminal: false,
            track_generation: true,
            resize: ResizeStatus {
                pending: Some(crate::allocation::Pending {
                    reason: crate::allocation::DEFERRED,
                    message: "no room".into(),
                }),
                in_progress: true,
                error: Some("runc: bad".into()),
            },
        });
        let types: Vec<&str> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types[..3],
            [
                "PodResizePending",
                "PodResizeInProgress",
                "PodReadyToStartContainers"
            ]
        );
        let pending = cond(&s, "PodResizePending");
        assert_eq!(
            (pending.status.as_str(), pending.reason.as_deref()),
            ("True", Some("Deferred"))
        );
        let progress = cond(&s, "PodResizeInProgress");
        assert_eq!(progress.reason.as_deref(), Some("Error"));
        assert_eq!(progress.message.as_deref(), Some("runc: bad"));
        let cs = app(&s);
        assert_eq!(cs.allocated_resources, q("500m", "32Mi"));
        assert_eq!(
            serde_json::to_value(&cs.user).unwrap(),
            serde_json::json!({"linux": {"uid": 1000, "gid": 3000, "supplementalGroups": [3000, 4000]}})
        );
        // What the runtime applied: cpu request from shares (rounded up),
        // the limits from quota and the memory limit; the memory request
        // is the grant's.
        let applied = cs.resources.as_ref().unwrap();
        assert_eq!(applied.requests, q("250m", "32Mi"));
        assert_eq!(applied.limits, q("500m", "32Mi"));
    }

    #[test]
    fn conditions_others_set_are_kept_first_as_upstream() {
        // Old code: the status held the kubelet's five conditions only, so a
        // readiness gate's condition never showed in the kubelet's status.
        let mut p = gated(Some("True"));
        p.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(PodCondition {
                type_: "ContainersReady".into(),
                status: "Unknown".into(),
                ..Default::default()
            });
        let previous = PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("TerminationByKubelet".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let s = gen_with(
            &p,
            &rt(vec![info("a", CState::Running, 0, 5, 0)]),
            &HashMap::new(),
            Some(&previous),
            false,
        );
        let types: Vec<&str> = s
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "example.com/lb",
                "DisruptionTarget",
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled"
            ]
        );
        assert_eq!(cond(&s, "Ready").status, "True", "the gate is met");
        assert_eq!(
            cond(&s, "ContainersReady").status,
            "True",
            "the kubelet's own"
        );
    }

    #[test]
    fn readiness_is_reconciled_when_a_gate_changes_as_upstream() {
        // Ready False, containers unknown: the expected Ready is False too,
        // but its message differs (the gate is not what is missing).
        assert!(
            !readiness_needs_reconcile(&pod("Always", &[], &["a"])),
            "no gates"
        );
        let mut p = gated(Some("True"));
        let ready = |p: &mut Pod| {
            let st = p.status.as_mut().unwrap();
            st.container_statuses = Some(vec![ContainerStatus {
                name: "a".into(),
                ready: true,
                ..Default::default()
            }]);
        };
        ready(&mut p);
        assert!(readiness_needs_reconcile(&p), "gate met, Ready still False");
        let mut unmet = gated(Some("False"));
        ready(&mut unmet);
        assert!(readiness_needs_reconcile(&unmet), "message differs");
        let cs = unmet.status.as_mut().unwrap().conditions.as_mut().unwrap();
        cs[0].message = Some(
            "the status of pod readiness gate \"example.com/lb\" is not \"True\", but False".into(),
        );
        cs[0].reason = Some("ReadinessGatesNotReady".into());
        assert!(!readiness_needs_reconcile(&unmet), "as expected");
        // No Ready condition at all: nothing to reconcile (upstream's i >= 0).
        let mut none = gated(None);
        none.status.as_mut().unwrap().conditions = Some(vec![]);
        assert!(!readiness_needs_reconcile(&none));
    }

    #[test]
    fn the_observed_generation_is_the_pods_as_upstream() {
        // Old code reported none: a controller waiting for the kubelet to
        // observe a spec change (PodObservedGenerationTracking, on in 1.34)
        // waited for good.
        let mut p = pod("Always", &[], &["a"]);
        p.metadata.generation = Some(3);
        let r = rt(vec![info("a", CState::Running, 0, 5, 0)]);
        let (waiting, readiness) = (HashMap::new(), HashMap::new());
        let status = |p: &Pod, track: bool| {
            generate_pod_status(&StatusInput {
                pod: p,
                rt: &r,
                waiting: &waiting,
                readiness: &readiness,
                not_started: &Default::default(),
                host_ip: "192.0.2.1",
                previous: None,
                now: Timestamp::UNIX_EPOCH,
                pod_is_terminal: false,
                track_generation: track,
                resize: Default::default(),
            })
        };
        let generations = |s: &PodStatus| -> Vec<Option<i64>> {
            let cs = s.conditions.as_ref().unwrap();
            cs.iter().map(|c| c.observed_generation).collect()
        };
        let s = status(&p, true);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(generations(&s), vec![Some(3); 5]);
        // The gate off: none, but where the API already holds one.
        let s = status(&p, false);
        assert_eq!(s.observed_generation, None);
        assert_eq!(generations(&s), vec![None; 5]);
        p.status = Some(PodStatus {
            observed_generation: Some(2),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                observed_generation: Some(2),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let s = status(&p, false);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(cond(&s, "Ready").observed_generation, Some(3));
        assert_eq!(cond(&s, "Initialized").observed_generation, None);
        // A static pod has no generation: none.
        let s = status(&pod("Always", &[], &["a"]), true);
        assert_eq!(s.observed_generation, None);
        assert_eq!(generations(&s), vec![None; 5]);
    }

    #[test]
    fn ephemeral_containers_get_statuses_as_upstream() {
        // Old code gave none: `kubectl debug` never saw its container run.
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "dbg".into(),
                image: Some("busybox:1.36".into()),
                target_container_name: Some("a".into()),
                ..Default::default()
            }]);
        let s = gen(
            &p,
            &rt(vec![info("a", CState::Running, 0, 5, 0)]),
            &HashMap::new(),
        );
        let e = &s.ephemeral_container_statuses.as_ref().unwrap()[0];
        let w = e.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
        let s = gen(
            &p,
            &rt(vec![
                info("a", CState::Running, 0, 5, 0),
                info("dbg", CState::Exited, 1, 6, 0),
            ]),
            &HashMap::new(),
        );
        let e = &s.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert_eq!(e.name, "dbg");
        assert_eq!(e.image, "docker.io/library/busybox:1.36");
        let t = e.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(t.exit_code, 1);
        assert!(!e.ready && e.started.is_none(), "{e:?}");
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(
            cond(&s, "Ready").status,
            "True",
            "a debugger weighs on nothing"
        );
        assert!(gen(
            &pod("Always", &[], &["a"]),
            &RuntimePod::default(),
            &HashMap::new()
        )
        .ephemeral_container_statuses
        .is_none());
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
    fn a_running_sidecar_does_not_block_the_phase_and_a_stopped_one_does_not_count() {
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

    /// Old behaviour: only regular containers counted, so a sidecar whose
    /// readiness probe had no result yet left the pod Ready.
    #[test]
    fn an_unready_sidecar_makes_the_pod_unready() {
        let mut p = sidecar_pod("Always");
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].readiness_probe =
            Some(Default::default());
        let s = gen(
            &p,
            &rt(vec![
                info("side", CState::Running, 0, 2, 0),
                info("a", CState::Running, 0, 3, 0),
            ]),
            &HashMap::new(),
        );
        for t in ["ContainersReady", "Ready"] {
            let c = cond(&s, t);
            assert_eq!(c.status, "False");
            assert_eq!(c.reason.as_deref(), Some("ContainersNotReady"));
            assert_eq!(
                c.message.as_deref(),
                Some("containers with unready status: [side]")
            );
        }
        let side = &s.init_container_statuses.as_ref().unwrap()[0];
        assert!(!side.ready);
    }

    /// Old behaviour: the pod turned Succeeded as soon as the app exited,
    /// while its sidecar was still running.
    #[test]
    fn a_running_sidecar_keeps_the_pod_running_until_it_is_stopped() {
        let p = sidecar_pod("Never");
        let s = gen(
            &p,
            &rt(vec![
                info("side", CState::Running, 0, 2, 0),
                info("a", CState::Exited, 0, 3, 0),
            ]),
            &HashMap::new(),
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    /// Old behaviour: a Failed pod's Ready and ContainersReady said
    /// ContainersNotReady with a list of containers.
    #[test]
    fn terminal_pods_are_unready_with_the_phase_as_reason_and_no_message() {
        for (code, phase, reason) in [(2, "Failed", "PodFailed"), (0, "Succeeded", "PodCompleted")]
        {
            let s = gen(
                &pod("Never", &[], &["a"]),
                &rt(vec![info("a", CState::Exited, code, 7, 0)]),
                &HashMap::new(),
            );
            assert_eq!(s.phase.as_deref(), Some(phase));
            for t in ["ContainersReady", "Ready"] {
                let c = cond(&s, t);
                assert_eq!(c.status, "False");
                assert_eq!(c.reason.as_deref(), Some(reason), "{t}");
                assert_eq!(c.message, None, "{t}");
            }
        }
    }

    /// Old behaviour: ready was false for every init container.
    #[test]
    fn an_init_container_that_exited_0_is_ready() {
        let p = pod("Always", &["i", "j"], &["a"]);
        let s = gen(
            &p,
            &rt(vec![
                info("i", CState::Exited, 0, 3, 0),
                info("j", CState::Exited, 1, 4, 0),
            ]),
            &HashMap::new(),
        );
        let inits = s.init_container_statuses.as_ref().unwrap();
        assert!(inits[0].ready);
        assert!(!inits[1].ready);
        assert_eq!(
            cond(&s, "Initialized").message.as_deref(),
            Some("containers with incomplete status: [j]")
        );
    }

    /// Old behaviour: a created, not yet started container said
    /// ContainerCreating; upstream shows it waiting without a reason.
    #[test]
    fn a_created_container_waits_without_a_reason() {
        let s = gen(
            &pod("Always", &[], &["a"]),
            &rt(vec![info("a", CState::Created, 0, 3, 0)]),
            &HashMap::new(),
        );
        let st = app(&s).state.clone().unwrap();
        let w = st.waiting.expect("waiting");
        assert_eq!(w.reason, None);
        assert_eq!(app(&s).container_id.as_deref(), Some("containerd://a3"));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
    }

    fn was_running(restarts: i32) -> PodStatus {
        let p = pod("Always", &[], &["a"]);
        gen(
            &p,
            &rt(vec![info("a", CState::Running, 0, 3, restarts)]),
            &HashMap::new(),
        )
    }

    /// Old behaviour: a container in unknown state went back to waiting
    /// (ContainerCreating), and the pod to Pending.
    #[test]
    fn a_running_container_now_unknown_is_terminated_status_unknown() {
        let p = pod("Always", &[], &["a"]);
        let prev = was_running(2);
        let s = gen_with(
            &p,
            &rt(vec![info("a", CState::Unknown, 0, 3, 2)]),
            &HashMap::new(),
            Some(&prev),
            false,
        );
        let t = app(&s)
            .state
            .clone()
            .unwrap()
            .terminated
            .expect("terminated");
        assert_eq!(t.reason.as_deref(), Some("ContainerStatusUnknown"));
        assert_eq!(t.exit_code, 137);
        assert_eq!(t.message.as_deref(), Some(MSG_NOT_LOCATED_TERMINATED));
        assert_eq!(app(&s).restart_count, 3);
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    /// Old behaviour: a running container that vanished from the runtime
    /// turned into a fresh ContainerCreating, and the pod went Pending.
    #[test]
    fn a_running_container_that_vanished_keeps_a_status_unknown_last_state() {
        let p = pod("Always", &[], &["a"]);
        let prev = was_running(2);
        let s = gen_with(&p, &rt(vec![]), &HashMap::new(), Some(&prev), false);
        let c = app(&s);
        let last = c.last_state.clone().unwrap().terminated.expect("lastState");
        assert_eq!(last.reason.as_deref(), Some("ContainerStatusUnknown"));
        assert_eq!(last.exit_code, 137);
        assert_eq!(
            last.message.as_deref(),
            Some("The container could not be located when the pod was deleted.  The container used to be Running")
        );
        assert_eq!(c.restart_count, 3);
        assert!(c.state.as_ref().unwrap().waiting.is_some());
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    /// Old behaviour: the phase went back to Running and the reason and
    /// message of the terminal status were dropped.
    #[test]
    fn a_terminal_status_keeps_its_phase_reason_and_message() {
        let p = pod("Always", &[], &["a"]);
        let mut prev = was_running(0);
        prev.phase = Some("Failed".into());
        prev.reason = Some("Evicted".into());
        prev.message = Some("The node was low on resource: memory.".into());
        let s = gen_with(
            &p,
            &rt(vec![info("a", CState::Running, 0, 3, 0)]),
            &HashMap::new(),
            Some(&prev),
            false,
        );
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            s.message.as_deref(),
            Some("The node was low on resource: memory.")
        );
    }

    /// Old behaviour: no notion of a terminated pod; an Always pod whose
    /// containers the worker stopped stayed Running for ever.
    #[test]
    fn the_terminal_phase_follows_the_worker_for_non_static_pods() {
        let done = rt(vec![info("a", CState::Exited, 0, 7, 0)]);
        let failed = rt(vec![info("a", CState::Exited, 137, 7, 0)]);
        let mut p = pod("Always", &[], &["a"]);
        let phase = |p: &Pod, r: &RuntimePod, term| {
            gen_with(p, r, &HashMap::new(), None, term).phase.unwrap()
        };
        // Until the worker has finished terminating, the restart policy rules.
        assert_eq!(phase(&p, &done, false), "Running");
        assert_eq!(phase(&p, &done, true), "Succeeded");
        assert_eq!(phase(&p, &failed, true), "Failed");
        let on_failure = pod("OnFailure", &[], &["a"]);
        assert_eq!(phase(&on_failure, &failed, false), "Running");
        assert_eq!(phase(&on_failure, &failed, true), "Failed");
        // Static pods are left out, as upstream (k/k #116484).
        p.metadata.annotations = Some(
            [(
                crate::source::CONFIG_SOURCE_ANNOTATION.to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        assert_eq!(phase(&p, &done, true), "Running");
    }
}
