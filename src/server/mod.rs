//! HTTP servers: the read-only port (`/pods`, `/healthz`, `/spec/`) and the
//! healthz port (upstream `pkg/kubelet/server/server.go`). Routers are built
//! apart from serving so tests call them directly.

pub mod machine;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::cri::RuntimeService;
use crate::pleg::PlegHandle;
use crate::pod::PodManager;
use crate::status::StatusManager;
use crate::syncloop::SyncLoopHealth;

#[derive(Clone)]
pub struct ServerState {
    pub pods: PodManager,
    pub status: StatusManager,
    pub pleg: PlegHandle,
    pub syncloop: SyncLoopHealth,
    pub runtime: Arc<dyn RuntimeService>,
    pub machine: Arc<machine::MachineInfo>,
    pub probes: crate::prober::ProbeManager,
}

/// `/healthz`: ok only when the syncLoop and PLEG are healthy and the
/// runtime answers; otherwise 500 with the failing checks, like upstream.
async fn healthz(State(s): State<ServerState>) -> Response {
    let mut failures = Vec::new();
    if let Err(e) = s.syncloop.healthy() {
        failures.push(format!("[-]syncloop failed: {e}"));
    }
    if let Err(e) = s.pleg.healthy() {
        failures.push(format!("[-]pleg failed: {e}"));
    }
    match tokio::time::timeout(Duration::from_secs(2), s.runtime.version()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => failures.push(format!("[-]runtime failed: {e}")),
        Err(_) => failures.push("[-]runtime failed: no answer within 2s".into()),
    }
    if failures.is_empty() {
        (StatusCode::OK, "ok").into_response()
    } else {
        let body = format!("{}\nhealthz check failed\n", failures.join("\n"));
        (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
    }
}

/// The pods with their current status as a `v1.PodList`.
pub fn pod_list(pods: &PodManager, status: &StatusManager) -> serde_json::Value {
    let items: Vec<serde_json::Value> = pods
        .pods()
        .iter()
        .map(|p| {
            let mut pod = (**p).clone();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if let Some(st) = status.get(&uid) {
                pod.status = Some((*st).clone());
            } else if pod.status.is_none() {
                pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                });
            }
            let mut v = serde_json::to_value(&pod).unwrap_or_default();
            // Upstream's list items carry no kind/apiVersion of their own.
            if let Some(o) = v.as_object_mut() {
                o.remove("kind");
                o.remove("apiVersion");
            }
            v
        })
        .collect();
    serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
}

fn json(v: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn pods(State(s): State<ServerState>) -> Response {
    json(&pod_list(&s.pods, &s.status))
}

async fn metrics_probes(State(s): State<ServerState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.probes.metrics_text(),
    )
        .into_response()
}

async fn spec(State(s): State<ServerState>) -> Response {
    json(&*s.machine)
}

/// The read-only port's routes.
pub fn read_only_router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/metrics/probes", get(metrics_probes))
        .route("/spec", get(spec))
        .route("/spec/", get(spec))
        .with_state(state)
}

/// The healthz port's routes.
pub fn healthz_router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(state)
}

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct ListenError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds now (so a busy port is reported at startup) and serves until the
/// token is cancelled.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    token: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ListenError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError { addr, source })?;
    tracing::info!(%addr, "serving");
    Ok(tokio::spawn(async move {
        let r = axum::serve(listener, router)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::error!(%addr, error = %e, "server failed");
        }
    }))
}
