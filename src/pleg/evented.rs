//! Evented PLEG: turns the runtime's GetContainerEvents stream into pod
//! lifecycle events the moment a container starts or dies (upstream
//! `pkg/kubelet/pleg/evented.go`, KEP-3386). The generic relist keeps
//! running beside it, so a broken or missing stream loses nothing; it only
//! makes status updates faster than the 1 s relist.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cri::v1::{ContainerEventResponse, ContainerEventType};
use crate::cri::RuntimeService;
use crate::kuberuntime::labels;

use super::{EventType, PodLifecycleEvent};

/// Maps one runtime event to a pod event; `None` for containers that are
/// not a kubelet's (no pod UID).
pub fn translate(ev: &ContainerEventResponse) -> Option<PodLifecycleEvent> {
    let sb = ev.pod_sandbox_status.as_ref()?;
    let uid = sb
        .labels
        .get(labels::POD_UID)
        .cloned()
        .or_else(|| sb.metadata.as_ref().map(|m| m.uid.clone()))
        .filter(|u| !u.is_empty())?;
    let kind = match ContainerEventType::try_from(ev.container_event_type) {
        Ok(ContainerEventType::ContainerStartedEvent) => EventType::ContainerStarted,
        Ok(ContainerEventType::ContainerStoppedEvent) => EventType::ContainerDied,
        Ok(ContainerEventType::ContainerDeletedEvent) => EventType::ContainerRemoved,
        _ => EventType::ContainerChanged,
    };
    Some(PodLifecycleEvent {
        uid,
        kind,
        id: ev.container_id.clone(),
    })
}

/// Follows the runtime's event stream, reconnecting with backoff. Against a
/// runtime without the RPC (containerd 1.6) it says so once and retries
/// rarely, in case the runtime is upgraded underneath.
pub fn spawn(
    runtime: Arc<dyn RuntimeService>,
    events: mpsc::Sender<PodLifecycleEvent>,
    token: CancellationToken,
) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(1);
        let mut said_unimplemented = false;
        loop {
            let (tx, mut rx) = mpsc::channel::<ContainerEventResponse>(256);
            let rt = runtime.clone();
            let stream = tokio::spawn(async move { rt.container_events(tx).await });
            let mut got_any = false;
            loop {
                tokio::select! {
                    _ = token.cancelled() => {
                        stream.abort();
                        return;
                    }
                    ev = rx.recv() => match ev {
                        Some(ev) => {
                            got_any = true;
                            if let Some(pe) = translate(&ev) {
                                debug!(pod_uid = %pe.uid, kind = ?pe.kind, id = %pe.id, "evented pleg: container event");
                                let _ = events.try_send(pe);
                            }
                        }
                        None => break,
                    }
                }
            }
            let wait = match stream.await {
                Ok(Err(e)) if e.is_unimplemented() => {
                    if !said_unimplemented {
                        info!("container runtime has no GetContainerEvents; relying on the generic PLEG relist");
                        said_unimplemented = true;
                    }
                    Duration::from_secs(300)
                }
                Ok(Err(e)) => {
                    warn!(error = %e, retry_in = ?backoff, "container event stream failed");
                    backoff
                }
                _ => backoff,
            };
            backoff = if got_any {
                Duration::from_secs(1)
            } else {
                (backoff * 2).min(Duration::from_secs(30))
            };
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::v1::{PodSandboxMetadata, PodSandboxStatus};

    #[test]
    fn runtime_events_map_to_pod_events() {
        let mut ev = ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: ContainerEventType::ContainerStoppedEvent as i32,
            pod_sandbox_status: Some(PodSandboxStatus {
                metadata: Some(PodSandboxMetadata {
                    uid: "u1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pe = translate(&ev).unwrap();
        assert_eq!(
            (pe.uid.as_str(), pe.kind, pe.id.as_str()),
            ("u1", EventType::ContainerDied, "c1")
        );
        ev.container_event_type = ContainerEventType::ContainerStartedEvent as i32;
        assert_eq!(translate(&ev).unwrap().kind, EventType::ContainerStarted);
        ev.pod_sandbox_status = None;
        assert!(translate(&ev).is_none(), "not a kubelet's container");
    }
}
