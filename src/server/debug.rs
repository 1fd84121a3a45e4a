//! `/debug/pods/{namespace}/{name}` (beyond upstream; authorized as
//! nodes/proxy): why a pod is as it is, from the kubelet's own state —
//! its worker phase and next sync, the last actions computed, restart and
//! pull backoff with their windows, pulls waiting or running, probe
//! results, blocking work that hangs — instead of reconstructing it from
//! events and logs.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::ServerState;
use crate::config::duration::format_go_duration;

/// What `/debug/pods` reads beyond the pod and status managers.
#[derive(Clone)]
pub struct DebugSources {
    pub workers: crate::podworkers::PodWorkers,
    pub queue: Arc<crate::podworkers::WorkQueue>,
    pub runtime: Arc<crate::kuberuntime::RuntimeManager>,
}

fn go(d: Duration) -> String {
    // Whole milliseconds: sub-millisecond precision only adds noise here.
    format_go_duration(Duration::from_millis(d.as_millis() as u64))
}

pub async fn pod(
    State(s): State<ServerState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    // A terminating pod too: why it is still there is worth asking.
    let Some(pod) = s.pods.by_name(&namespace, &name) else {
        return (
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} is not on this node\n"),
        )
            .into_response();
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut out = json!({
        "pod": {"namespace": namespace, "name": name, "uid": uid},
        "status": s.status.get(&uid).map(|st| serde_json::to_value(&*st).unwrap_or_default()),
    });
    if let Some(d) = &s.debug {
        out["worker"] = json!({
            "phase": d.workers.phase(&uid).map(|p| format!("{p:?}")),
            "nextSyncIn": d.queue.due_in(&uid).map(go),
        });
        let spec = pod.spec.clone().unwrap_or_default();
        let init: Vec<String> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        let main: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
        out["lastActions"] = match d.runtime.last_actions(&uid) {
            Some((at, a)) => json!({
                "at": crate::source::format_timestamp(at),
                "killPod": a.kill_pod,
                "createSandbox": a.create_sandbox,
                "attempt": a.attempt,
                "initContainersToStart": a.init_to_start.iter().filter_map(|i| init.get(*i)).collect::<Vec<_>>(),
                "containersToStart": a.containers_to_start.iter().filter_map(|i| main.get(*i)).collect::<Vec<_>>(),
                "containersToKill": a.containers_to_kill.iter().map(|k| json!({"name": k.name, "reason": k.reason})).collect::<Vec<_>>(),
            }),
            None => Value::Null,
        };
        out["restartBackoff"] = d
            .runtime
            .restart_backoff(&pod)
            .into_iter()
            .map(|(c, window, since)| {
                json!({"container": c, "window": go(window), "sinceLastRestart": go(since)})
            })
            .collect();
        let now = crate::kuberuntime::wall_now();
        out["imagePullBackoff"] = d
            .runtime
            .images
            .pod_backoff(&uid, now)
            .into_iter()
            .map(|(image, window, since)| {
                json!({"image": image, "window": go(window),
                    "expiresIn": go(window.saturating_sub(since))})
            })
            .collect();
        out["imagePulls"] = d
            .runtime
            .images
            .pod_pulls(&uid)
            .into_iter()
            .map(|(image, for_)| json!({"image": image, "for": go(for_)}))
            .collect();
        let vm = &d.runtime.volumes;
        out["volumes"] = vm
            .pod_volumes(&uid)
            .into_iter()
            .map(|(name, path)| json!({"name": name, "path": path}))
            .collect();
        // What the pod's containers wait for: volumes failing to set up.
        out["volumesWaitedOn"] = vm
            .failing(&uid)
            .into_iter()
            .map(|(name, error, retry)| {
                json!({"name": name, "error": error, "nextAttemptIn": go(retry)})
            })
            .collect();
    }
    out["probes"] = s
        .probes
        .debug_states(&uid)
        .into_iter()
        .map(|(c, t, r)| {
            json!({"container": c, "probe": t,
                "result": match r { Some(true) => "success", Some(false) => "failure", None => "pending" }})
        })
        .collect();
    out["blockedOn"] = crate::blocking::stuck_keys()
        .into_iter()
        .filter(|k| k.contains(&uid))
        .collect();
    super::json(&out)
}
