//! The stats provider (instead of cAdvisor): `/stats/summary`,
//! `/metrics/resource` and `/metrics/cadvisor`.

use axum::Router;

use crate::server::ServerState;

/// `/stats/summary`, `/metrics/resource`, `/metrics/cadvisor`.
pub fn routes() -> Router<ServerState> {
    Router::new()
}
