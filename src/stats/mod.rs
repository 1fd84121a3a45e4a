//! The stats provider (instead of cAdvisor): `/stats/summary`,
//! `/metrics/resource` and `/metrics/cadvisor` (upstream
//! `pkg/kubelet/server/stats`, `pkg/kubelet/stats`, and the cAdvisor
//! Prometheus collector). Figures come from cgroup and /proc files read on
//! demand off the async threads, and from the CRI; see `provider`.

pub mod cgroup;
pub mod expo;
pub mod procfs;
pub mod provider;
pub mod summary;
pub mod types;

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use provider::{StatsConfig, StatsError, StatsProvider};

use crate::server::ServerState;

/// `/stats/summary`, `/metrics/resource`, `/metrics/cadvisor`.
pub fn routes() -> Router<ServerState> {
    Router::new()
        .route("/stats/summary", get(stats_summary).post(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route("/metrics/cadvisor", get(metrics_cadvisor))
}

fn stats_config(s: &ServerState) -> StatsConfig {
    StatsConfig {
        cgroup_root: s.config.cgroup_root.clone(),
        systemd: s.config.cgroup_driver == "systemd",
        root_dir: s.root_dir.clone(),
        pod_logs_dir: s.pod_logs_dir.clone(),
    }
}

async fn snapshot(
    s: &ServerState,
    full: bool,
) -> Result<std::sync::Arc<provider::Snapshot>, StatsError> {
    s.stats
        .snapshot(s.runtime.clone(), s.images.clone(), stats_config(s), full)
        .await
}

const PROM_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upstream reads `only_cpu_and_memory` with strconv.ParseBool.
fn only_cpu_and_memory(q: Option<&str>) -> bool {
    q.unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .any(|(k, v)| {
            k == "only_cpu_and_memory" && matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
        })
}

async fn stats_summary(State(s): State<ServerState>, RawQuery(q): RawQuery) -> Response {
    let only = only_cpu_and_memory(q.as_deref());
    match snapshot(&s, !only).await {
        Ok(snap) => {
            let sum = summary::build(&snap, &s.node_name, only);
            match serde_json::to_vec(&sum) {
                Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "stats summary failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Error: failed to get summary stats: {e}"),
            )
                .into_response()
        }
    }
}

async fn metrics_resource(State(s): State<ServerState>) -> Response {
    let snap = snapshot(&s, false).await;
    if let Err(e) = &snap {
        tracing::warn!(error = %e, "resource metrics collection failed");
    }
    let body = expo::resource(snap.as_deref().ok(), &s.node_name);
    ([(header::CONTENT_TYPE, PROM_TEXT)], body).into_response()
}

async fn metrics_cadvisor(State(s): State<ServerState>) -> Response {
    let snap = snapshot(&s, true).await;
    if let Err(e) = &snap {
        tracing::warn!(error = %e, "cadvisor metrics collection failed");
    }
    let m = &s.machine;
    let machine = expo::Machine {
        machine_id: &m.machine_id,
        system_uuid: &m.system_uuid,
        boot_id: &m.boot_id,
        cores: m.num_cores,
        memory: m.memory_capacity,
    };
    let body = expo::cadvisor(snap.as_deref().ok(), &machine);
    ([(header::CONTENT_TYPE, PROM_TEXT)], body).into_response()
}
