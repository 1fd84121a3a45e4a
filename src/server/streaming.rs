//! Streaming: `/exec`, `/attach`, `/portForward`, `/run`, proxied to the
//! runtime's streaming server.

use axum::Router;

use crate::server::ServerState;

/// `/exec/...`, `/attach/...`, `/portForward/...`, `/run/...`.
pub fn routes() -> Router<ServerState> {
    Router::new()
}
