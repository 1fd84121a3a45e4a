//! HTTP servers: the read-only port (`/pods`, `/healthz`, `/spec/`) and the
//! healthz port (upstream `pkg/kubelet/server/server.go`). Routers are built
//! apart from serving so tests call them directly.

pub mod machine;
pub mod streaming;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

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
    pub machine: Arc<machine::MachineInfo>,
    pub probes: crate::prober::ProbeManager,
    pub runtime_state: crate::runtimestate::RuntimeState,
    /// Cluster mode: whether the API server answers (informational only).
    pub api: Option<crate::apiclient::ApiHealth>,
    pub runtime: Arc<dyn crate::cri::RuntimeService>,
    pub images: Arc<dyn crate::cri::ImageService>,
    /// The running configuration (for /configz and the handlers' limits).
    pub config: Arc<crate::config::KubeletConfiguration>,
    pub node_name: String,
    pub root_dir: std::path::PathBuf,
    pub pod_logs_dir: std::path::PathBuf,
}

impl ServerState {
    /// A state over `runtime` (the fake, or a `RemoteRuntime` in integration
    /// tests) for handler tests:
    /// empty pod and status managers, default configuration, a PLEG and
    /// runtime poller that stop with the returned token.
    pub fn for_tests<R>(runtime: Arc<R>) -> (Self, CancellationToken)
    where
        R: crate::cri::RuntimeService + crate::cri::ImageService,
    {
        let token = CancellationToken::new();
        let (pleg_tx, _) = tokio::sync::mpsc::channel(1);
        let rt: Arc<dyn crate::cri::RuntimeService> = runtime.clone();
        let pleg = crate::pleg::spawn(
            rt.clone(),
            std::time::Duration::from_secs(3600),
            pleg_tx,
            token.child_token(),
        );
        let (runtime_state, _) = crate::runtimestate::spawn(
            rt.clone(),
            std::time::Duration::from_secs(3600),
            token.child_token(),
        );
        let (probe_tx, _) = tokio::sync::mpsc::channel(1);
        let state = ServerState {
            pods: PodManager::new(),
            status: StatusManager::new(),
            pleg,
            syncloop: SyncLoopHealth::new(std::time::Duration::from_secs(60)),
            machine: Arc::new(machine::MachineInfo::default()),
            probes: crate::prober::ProbeManager::new(rt.clone(), probe_tx, token.child_token()),
            runtime_state,
            api: None,
            runtime: rt,
            images: runtime,
            config: Arc::new(crate::config::KubeletConfiguration::default()),
            node_name: "node".into(),
            root_dir: std::env::temp_dir().join("rkubelet-server-tests"),
            pod_logs_dir: std::env::temp_dir().join("rkubelet-server-tests/logs"),
        };
        (state, token)
    }
}

/// The named checks behind `/healthz`, in upstream's order (ping, log,
/// syncloop), then rkubelet's own: PLEG and the container runtime. A
/// runtime that is unreachable or not ready fails /healthz (rkubelet's
/// documented choice; upstream reports it on the Node's Ready condition).
fn health_checks(s: &ServerState) -> Vec<(&'static str, Result<(), String>)> {
    vec![
        ("ping", Ok(())),
        ("log", Ok(())),
        ("syncloop", s.syncloop.healthy()),
        ("pleg", s.pleg.healthy()),
        (
            "runtime",
            s.runtime_state.runtime_error().map_or(Ok(()), Err),
        ),
    ]
}

/// Upstream's healthz handler (`k8s.io/apiserver/pkg/server/healthz`):
/// `ok` when every check passes; with `?verbose`, one `[+]name ok` line per
/// check; on failure a 500 listing every check, the failing ones as
/// `[-]name failed: reason withheld` (with `?verbose`, the reason itself).
/// `?exclude=name` leaves a check out.
pub fn healthz_body(
    checks: &[(&'static str, Result<(), String>)],
    query: &str,
) -> (StatusCode, String) {
    let params: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    let verbose = params.iter().any(|(k, _)| *k == "verbose");
    let excluded = |name: &str| params.iter().any(|(k, v)| *k == "exclude" && *v == name);
    let mut out = String::new();
    let mut failed = false;
    for (name, r) in checks {
        if excluded(name) {
            out.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match r {
            Ok(()) => out.push_str(&format!("[+]{name} ok\n")),
            Err(e) => {
                failed = true;
                let why = if verbose {
                    e.as_str()
                } else {
                    "reason withheld"
                };
                out.push_str(&format!("[-]{name} failed: {why}\n"));
            }
        }
    }
    if failed {
        out.push_str("healthz check failed\n");
        (StatusCode::INTERNAL_SERVER_ERROR, out)
    } else if verbose {
        out.push_str("healthz check passed\n");
        (StatusCode::OK, out)
    } else {
        (StatusCode::OK, "ok".into())
    }
}

async fn healthz(State(s): State<ServerState>, RawQuery(q): RawQuery) -> Response {
    let checks = health_checks(&s);
    let query = q.as_deref().unwrap_or_default();
    let (code, mut body) = healthz_body(&checks, query);
    // The API server's reachability is shown, never failed on: a kubelet
    // whose API server is away keeps its pods and stays healthy.
    if let (Some(api), true) = (
        &s.api,
        body.ends_with("check passed\n") || body.ends_with("check failed\n"),
    ) {
        let line = match api.status() {
            Ok(()) => "[+]apiserver ok\n".to_string(),
            Err(e) if query.contains("verbose") => {
                format!(
                    "[+]apiserver unreachable (informational; retrying, pods keep running): {e}\n"
                )
            }
            Err(_) => "[+]apiserver unreachable (informational)\n".to_string(),
        };
        let at = body.rfind("healthz check").unwrap_or(body.len());
        body.insert_str(at, &line);
    }
    if code != StatusCode::OK {
        let failing: Vec<String> = checks
            .iter()
            .filter_map(|(n, r)| r.as_ref().err().map(|e| format!("{n}: {e}")))
            .collect();
        tracing::debug!(checks = ?failing, "healthz check failed");
    }
    (code, body).into_response()
}

/// `/healthz/<name>`: one check on its own, as upstream installs them.
async fn healthz_one(State(s): State<ServerState>, Path(name): Path<String>) -> Response {
    match health_checks(&s).into_iter().find(|(n, _)| *n == name) {
        Some((_, Ok(()))) => (StatusCode::OK, "ok").into_response(),
        Some((_, Err(e))) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {e}\n"),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
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

async fn spec(State(s): State<ServerState>) -> Response {
    json(&*s.machine)
}

/// Upstream's default handlers, served on both :10250 and the read-only
/// port: healthz, pods, stats and the metric endpoints.
pub fn default_routes() -> Router<ServerState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/{name}", get(healthz_one))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/spec", get(spec))
        .route("/spec/", get(spec))
        .merge(crate::metrics::routes())
        .merge(crate::stats::routes())
}

/// Upstream's debugging handlers (`enableDebuggingHandlers`), served only
/// on the authenticated port: logs, exec/attach/port-forward, configz.
pub fn debugging_routes() -> Router<ServerState> {
    Router::new()
        .merge(crate::logs::routes())
        .merge(streaming::routes())
}

/// The read-only port's routes.
pub fn read_only_router(state: ServerState) -> Router {
    default_routes()
        .layer(axum::middleware::from_fn(|req, next| {
            crate::metrics::track_http("readonly", req, next)
        }))
        .with_state(state)
}

/// The healthz port's routes.
pub fn healthz_router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/{name}", get(healthz_one))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(runtime: Result<(), String>) -> Vec<(&'static str, Result<(), String>)> {
        vec![
            ("ping", Ok(())),
            ("log", Ok(())),
            ("syncloop", Ok(())),
            ("pleg", Ok(())),
            ("runtime", runtime),
        ]
    }

    #[test]
    fn healthz_speaks_upstreams_format() {
        assert_eq!(
            healthz_body(&checks(Ok(())), ""),
            (StatusCode::OK, "ok".into())
        );
        let (code, body) = healthz_body(&checks(Ok(())), "verbose");
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "[+]ping ok\n[+]log ok\n[+]syncloop ok\n[+]pleg ok\n[+]runtime ok\nhealthz check passed\n"
        );
        let down = || checks(Err("container runtime is down".into()));
        let (code, body) = healthz_body(&down(), "");
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            body.contains("[-]runtime failed: reason withheld\n"),
            "{body}"
        );
        assert!(body.ends_with("healthz check failed\n"));
        let (_, body) = healthz_body(&down(), "verbose");
        assert!(
            body.contains("[-]runtime failed: container runtime is down\n"),
            "{body}"
        );
        let (code, body) = healthz_body(&down(), "exclude=runtime");
        assert_eq!(code, StatusCode::OK, "{body}");
    }
}
