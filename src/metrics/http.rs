//! `kubelet_http_requests_total`, `kubelet_http_requests_duration_seconds`
//! and `kubelet_http_inflight_requests` (upstream
//! `pkg/kubelet/server/metrics/metrics.go`, labelled as `server.go`'s
//! `ServeHTTP` does: method, path bucket, server type, long-running; the
//! older `host` label is gone upstream).

use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use tokio::time::Instant;

use super::{HttpLabels, METRICS};

/// Axum middleware counting and timing every request of a server.
///
/// Apply it to a whole router with
/// `router.layer(axum::middleware::from_fn(|req, next| crate::metrics::track_http("readonly", req, next)))`.
/// `server_type` is `"readonly"` for the read-only port (:10255) and, as
/// upstream's `ServeHTTP` labels it, `"readwrite"` for the authenticated
/// port (:10250). Layer it outermost (after auth layers are added), so
/// rejected requests are counted too, as upstream counts before its filters.
pub async fn track_http(server_type: &'static str, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let bucket = bucket(path);
    let labels = HttpLabels {
        method: method_bucket(req.method()),
        path: bucket,
        server_type,
        long_running: if is_long_running(bucket) {
            "true"
        } else {
            "false"
        },
    };
    let m = &*METRICS;
    m.http_requests.get_or_create(&labels).inc();
    let inflight = m.http_inflight_requests.get_or_create(&labels).clone();
    inflight.inc();
    // Decrements even when the handler's future is dropped (client gone).
    let _guard = Dec(inflight);
    let start = Instant::now();
    let resp = next.run(req).await;
    m.http_requests_duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    resp
}

struct Dec(prometheus_client::metrics::gauge::Gauge);

impl Drop for Dec {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Upstream's metric buckets (`addMetricsBucketMatcher` calls in
/// `server.go`); any other root is `other`.
const BUCKETS: &[&str] = &[
    "healthz",
    "pods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
    "spec",
    "logs",
    "containerLogs",
    "run",
    "exec",
    "attach",
    "portForward",
    "runningpods",
    "configz",
    "debug",
    "checkpoint",
];

/// The first path segment, or `metrics/<second>` under `/metrics/`, as
/// upstream's `getURLRootPath` + `getMetricBucket`.
pub(super) fn bucket(path: &str) -> &'static str {
    let p = path.trim_start_matches('/');
    let mut parts = p.splitn(3, '/');
    let first = parts.next().unwrap_or("");
    let root_len = match (first, parts.next()) {
        ("metrics", Some(second)) if !second.is_empty() => first.len() + 1 + second.len(),
        _ => first.len(),
    };
    let root = &p[..root_len];
    BUCKETS
        .iter()
        .find(|b| **b == root)
        .copied()
        .unwrap_or("other")
}

fn method_bucket(m: &Method) -> &'static str {
    match *m {
        Method::OPTIONS => "OPTIONS",
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// Upstream's `isLongRunningRequest`.
fn is_long_running(bucket: &str) -> bool {
    matches!(bucket, "exec" | "attach" | "portForward" | "debug")
}
