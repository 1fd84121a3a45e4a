//! Container logs: `/containerLogs/...`, `/logs/...`, and log rotation.

use axum::Router;

use crate::server::ServerState;

/// `/containerLogs/{ns}/{pod}/{container}` and `/logs/`.
pub fn routes() -> Router<ServerState> {
    Router::new()
}
