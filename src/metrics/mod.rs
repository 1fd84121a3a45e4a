//! The kubelet's own metrics (`/metrics`, `/metrics/probes`) with
//! upstream's names, types, labels and buckets
//! (`pkg/kubelet/metrics/metrics.go`).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::server::ServerState;

/// `/metrics` and `/metrics/probes`.
pub fn routes() -> Router<ServerState> {
    Router::new().route("/metrics/probes", get(metrics_probes))
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
