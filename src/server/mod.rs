//! HTTP servers: the authenticated port, the read-only port (`/pods`,
//! `/healthz`, stats and metrics) and the healthz port (upstream `pkg/kubelet/server/server.go`). Routers are built
//! apart from serving so tests call them directly.

pub mod auth;
pub mod checkpoint;
pub mod debug;
pub mod encoding;
pub mod https;
pub mod machine;
pub mod mux;
pub mod streaming;

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
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
    /// The machine's facts, for cAdvisor's `machine_*` families.
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
    /// The kubelet's internals for `/debug/pods` (absent in handler tests).
    pub debug: Option<debug::DebugSources>,
    /// The stats provider behind /stats/summary and /metrics/{resource,cadvisor}.
    pub stats: crate::stats::StatsProvider,
    /// Spliced exec/attach/port-forward connections, ended at shutdown.
    pub streams: Streams,
    /// `/metrics/slis`, which each `/healthz` request records into.
    pub slis: crate::metrics::slis::Slis,
}

/// The tasks that carry upgraded streaming connections once their HTTP
/// request has been answered: tracked, so shutdown can end and await them.
#[derive(Clone, Default)]
pub struct Streams {
    pub tracker: tokio_util::task::TaskTracker,
    pub token: tokio_util::sync::CancellationToken,
}

impl Streams {
    pub fn new(token: tokio_util::sync::CancellationToken) -> Self {
        Streams {
            tracker: Default::default(),
            token,
        }
    }

    /// Ends every spliced connection and waits (up to `within`) for their
    /// tasks; false if some did not finish in time.
    pub async fn shut_down(&self, within: std::time::Duration) -> bool {
        self.token.cancel();
        self.tracker.close();
        tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_ok()
    }
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
            Default::default(),
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
            debug: None,
            stats: Default::default(),
            streams: Default::default(),
            slis: Default::default(),
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
/// `[-]name failed: reason withheld`, verbose or not (the endpoint is
/// public: the reason goes to the log only). `?exclude=name` leaves a check
/// out; a name that matches none is warned of. Each check run is recorded
/// in `slis`, as that handler records it.
pub fn healthz_body(
    checks: &[(&'static str, Result<(), String>)],
    query: &str,
    slis: &crate::metrics::slis::Slis,
) -> (StatusCode, String) {
    let params: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    let verbose = params.iter().any(|(k, _)| *k == "verbose");
    let excludes: std::collections::BTreeSet<&str> = params
        .iter()
        .filter(|(k, _)| *k == "exclude")
        .map(|(_, v)| *v)
        .collect();
    let excluded = |name: &str| excludes.contains(name);
    let mut out = String::new();
    let mut failed = false;
    for (name, r) in checks {
        if excluded(name) {
            out.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        slis.observe(name, "healthz", r.is_ok());
        match r {
            Ok(()) => out.push_str(&format!("[+]{name} ok\n")),
            Err(e) => {
                failed = true;
                tracing::debug!(check = name, reason = %e, "health check failed");
                out.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    let unmatched: Vec<String> = excludes
        .iter()
        .filter(|x| !checks.iter().any(|(n, _)| n == *x))
        .map(|x| format!("{x:?}"))
        .collect();
    if !unmatched.is_empty() {
        out.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            unmatched.join(",")
        ));
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
    let (code, mut body) = healthz_body(&checks, query, &s.slis);
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
    healthz_text(code, body)
}

/// The healthz handler's answers: text, not to be sniffed (apiserver's
/// healthz writes these headers, and http.Error on failure).
fn healthz_text(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `/healthz/<name>`: one check on its own, as upstream installs them.
async fn healthz_one(State(s): State<ServerState>, Path(name): Path<String>) -> Response {
    match health_checks(&s).into_iter().find(|(n, _)| *n == name) {
        Some((_, Ok(()))) => healthz_text(StatusCode::OK, "ok".into()),
        Some((_, Err(e))) => healthz_text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {e}\n"),
        ),
        None => not_found().await,
    }
}

/// The pods as a `v1.PodList` (upstream GetPods): every pod the pod
/// manager holds, terminating ones included. An API pod shows its status as
/// the API last sent it (RECONCILE keeps the copy current, with conditions
/// others set); a static pod, which has no API object of its own, shows the
/// status manager's.
pub fn pod_list(pods: &PodManager, status: &StatusManager) -> serde_json::Value {
    let items: Vec<serde_json::Value> = pods
        .listed()
        .iter()
        .map(|p| {
            let mut pod = (**p).clone();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let own = (!crate::status::apisync::is_api_pod(&pod))
                .then(|| status.get(&uid))
                .flatten();
            if let Some(st) = own {
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

/// Upstream's default handlers, served on both :10250 and the read-only
/// port: healthz, pods, stats and the metric endpoints.
pub fn default_routes() -> Router<ServerState> {
    Router::new()
        .route("/healthz", any(healthz))
        .route("/healthz/{name}", any(healthz_one))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route(
            "/checkpoint/{namespace}/{pod}/{container}",
            axum::routing::post(checkpoint_if_gated),
        )
        .merge(crate::metrics::routes())
        .merge(crate::stats::routes())
}

/// `/checkpoint/...` exists while the ContainerCheckpoint gate is on.
async fn checkpoint_if_gated(
    s: State<ServerState>,
    path: Path<(String, String, String)>,
    query: RawQuery,
) -> Response {
    if !s.config.feature_gate("ContainerCheckpoint") {
        return not_found().await;
    }
    checkpoint::checkpoint(s, path, query).await
}

/// Upstream's debugging handlers (`enableDebuggingHandlers`), served only
/// on the authenticated port: logs, exec/attach/port-forward, configz, the
/// verbosity setter, and a refusal for the profiling endpoint when
/// `enableProfilingHandler` is off (Go's pprof itself has no equivalent).
pub fn debugging_routes(cfg: &crate::config::KubeletConfiguration) -> Router<ServerState> {
    let mut r = Router::new();
    if !cfg.enable_profiling_handler {
        r = refuse_under(r, &["/debug/pprof/"], "profiling endpoint is disabled.");
    }
    r.route("/debug/flags/v", any(debug_flags_v))
        .route("/configz", any(configz))
        .route("/runningpods", get(running_pods))
        .route("/runningpods/", get(running_pods))
        .route("/debug/pods/{namespace}/{name}", get(debug::pod))
        .merge(crate::logs::routes())
        .merge(streaming::routes())
}

/// What upstream's `InstallDebuggingDisabledHandlers` answers under these
/// prefixes, on the read-only port and when `enableDebuggingHandlers` is
/// off.
pub(crate) const DEBUG_PREFIXES: [&str; 8] = [
    "/run/",
    "/exec/",
    "/attach/",
    "/portForward/",
    "/containerLogs/",
    "/runningpods/",
    "/debug/pprof/",
    "/logs/",
];

/// The debugging handlers' places, refusing (405) as upstream's do when
/// they are not served.
pub fn debugging_disabled_routes() -> Router<ServerState> {
    refuse_under(
        Router::new(),
        &DEBUG_PREFIXES,
        "Debug endpoints are disabled.",
    )
}

/// `r` with every path under each of `prefixes` (a Go ServeMux pattern
/// ending in `/`) answered as `http.Error(w, msg, 405)`.
fn refuse_under(
    mut r: Router<ServerState>,
    prefixes: &[&str],
    msg: &'static str,
) -> Router<ServerState> {
    for p in prefixes {
        let refuse = any(move || async move { go_http_error(StatusCode::METHOD_NOT_ALLOWED, msg) });
        r = r
            .route(p, refuse.clone())
            .route(&format!("{p}{{*rest}}"), refuse);
    }
    r
}

/// Go's `http.Error`: the message and a newline as UTF-8 text, not to be
/// sniffed.
pub fn go_http_error(code: StatusCode, msg: &str) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{msg}\n"),
    )
        .into_response()
}

/// `/debug/flags/v` (upstream's `InstallDebugFlagsHandler`, apiserver's
/// `StringFlagPutHandler` over `logs.GlogSetter`): `PUT` a klog verbosity
/// to change rkubelet's log level while it runs.
async fn debug_flags_v(
    State(s): State<ServerState>,
    method: axum::http::Method,
    body: axum::body::Bytes,
) -> Response {
    if !s.config.enable_debug_flags_handler {
        return go_http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "flags endpoint is disabled.",
        );
    }
    // apiserver's writePlainText.
    let plain = |code: StatusCode, text: String| {
        (
            code,
            [
                (header::CONTENT_TYPE, "text/plain"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            format!("{text}\n"),
        )
            .into_response()
    };
    if method != axum::http::Method::PUT {
        return plain(StatusCode::NOT_ACCEPTABLE, "unsupported http method".into());
    }
    match crate::logging::glog_setter(&String::from_utf8_lossy(&body)) {
        Ok(m) => plain(StatusCode::OK, m),
        Err(e) => plain(StatusCode::BAD_REQUEST, e),
    }
}

/// `/configz`: the running configuration in upstream's envelope
/// (`{"kubeletconfig": {...}}`), serialized as the v1beta1 file is.
async fn configz(State(s): State<ServerState>) -> Response {
    let body = match serde_json::to_vec(&serde_json::json!({ "kubeletconfig": &*s.config })) {
        Ok(b) => go_html_escaped(b),
        Err(e) => {
            return go_http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("error marshaling json: {e}"),
            )
        }
    };
    // component-base's configz: any method, and not to be sniffed.
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// JSON as Go's json.Marshal writes it: `<`, `>`, `&`, U+2028 and U+2029
/// escaped (they can only be inside strings, so the value is the same).
fn go_html_escaped(json: Vec<u8>) -> Vec<u8> {
    if !json.iter().any(|b| matches!(b, b'<' | b'>' | b'&' | 0xE2)) {
        return json;
    }
    let text = String::from_utf8(json).unwrap_or_default();
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// `/runningpods/`: what the runtime runs, as upstream's GetRunningPods:
/// a `v1.PodList` of pods with only name, namespace, UID and each running
/// container's name and image.
async fn running_pods(State(s): State<ServerState>) -> Response {
    use crate::kuberuntime::labels;
    let running = crate::cri::v1::ContainerStateValue {
        state: crate::cri::ContainerState::ContainerRunning as i32,
    };
    let filter = crate::cri::ContainerFilter {
        state: Some(running),
        ..Default::default()
    };
    let (sandboxes, containers) = match tokio::try_join!(
        s.runtime.list_pod_sandbox(None),
        s.runtime.list_containers(Some(filter))
    ) {
        Ok(r) => r,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let mut pods: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
    type Labels = std::collections::HashMap<String, String>;
    fn label(l: &Labels, k: &str) -> String {
        l.get(k).cloned().unwrap_or_default()
    }
    /// A pod's entry, keyed by UID, from the labels of any of its objects.
    fn entry<'a>(
        pods: &'a mut std::collections::BTreeMap<String, serde_json::Value>,
        l: &Labels,
    ) -> &'a mut serde_json::Value {
        let uid = label(l, labels::POD_UID);
        pods.entry(uid.clone()).or_insert_with(|| {
            serde_json::json!({"metadata": {"name": label(l, labels::POD_NAME),
                "namespace": label(l, labels::POD_NAMESPACE), "uid": uid,
                "creationTimestamp": null},
                "spec": {"containers": []}, "status": {}})
        })
    }
    for sb in sandboxes
        .iter()
        .filter(|sb| sb.state == crate::cri::PodSandboxState::SandboxReady as i32)
    {
        entry(&mut pods, &sb.labels);
    }
    for c in &containers {
        let pod = entry(&mut pods, &c.labels);
        let image = c
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if let Some(list) = pod["spec"]["containers"].as_array_mut() {
            list.push(serde_json::json!({
                "name": label(&c.labels, labels::CONTAINER_NAME),
                "image": image,
                "resources": {},
            }));
        }
    }
    let items: Vec<serde_json::Value> = pods.into_values().collect();
    json(
        &serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
    )
}

/// The read-only port's routes.
pub fn read_only_router(state: ServerState) -> Router {
    let mux = Arc::new(mux::GoMux::read_only(&state.config));
    default_routes()
        .merge(debugging_disabled_routes())
        .fallback(restful_not_found)
        .layer(axum::middleware::from_fn(|req, next| {
            crate::metrics::track_http("readonly", req, next)
        }))
        .layer(axum::middleware::from_fn_with_state(mux, mux::filter))
        .with_state(state)
}

/// The healthz port's routes.
pub fn healthz_router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", any(healthz))
        .route("/healthz/{name}", any(healthz_one))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(mux::GoMux::healthz()),
            mux::filter,
        ))
        .with_state(state)
}

pub use https::{serve, ListenError};

/// The authenticated port's routes (upstream's default handlers, then the
/// debugging handlers when `enableDebuggingHandlers`), every one behind
/// the authentication and authorization filter.
pub fn api_router(state: ServerState, auth: Arc<auth::Auth>) -> Router {
    let mut r = default_routes();
    r = if state.config.enable_debugging_handlers {
        r.merge(debugging_routes(&state.config))
    } else {
        r.merge(debugging_disabled_routes())
    };
    // Paths under a registered prefix that no handler takes are
    // authorized before their 404, as go-restful runs its filters first;
    // paths under none are Go's 404 before any of it (the mux).
    let mux = Arc::new(mux::GoMux::api(&state.config));
    r.fallback(restful_not_found)
        .layer(axum::middleware::from_fn_with_state(auth, auth::filter))
        // Outside the filter, so refused requests are counted too;
        // upstream's server_type for the authenticated port.
        .layer(axum::middleware::from_fn(|req, next| {
            crate::metrics::track_http("readwrite", req, next)
        }))
        .layer(axum::middleware::from_fn_with_state(mux, mux::filter))
        .with_state(state)
}

async fn not_found() -> Response {
    go_http_error(StatusCode::NOT_FOUND, "404 page not found")
}

/// go-restful's answer for a path under a web service's root that none of
/// its routes takes.
async fn restful_not_found() -> Response {
    restful_text(StatusCode::NOT_FOUND, "404: Page Not Found".into())
}

/// An answer as go-restful's WriteErrorString writes one: the text as it
/// is, its type sniffed by Go as UTF-8 text.
pub fn restful_text(code: StatusCode, body: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
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
    fn pods_lists_as_upstreams_get_pods() {
        // Old code: a deleted pod vanished from /pods as its grace period
        // began, and an API pod showed the status manager's status, without
        // the conditions others set.
        use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
        let pods = PodManager::new();
        let status = StatusManager::new();
        let pod = |name: &str, source: &str| {
            let mut p = crate::testutil::named_pod(name, &format!("u-{name}"));
            p.metadata.annotations = Some(
                [(
                    crate::source::CONFIG_SOURCE_ANNOTATION.to_string(),
                    source.to_string(),
                )]
                .into(),
            );
            p
        };
        let phase = |p: &str| PodStatus {
            phase: Some(p.into()),
            ..Default::default()
        };
        let mut api = pod("api", crate::source::API_SOURCE);
        api.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "example.com/lb".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pods.upsert(api);
        status.set("u-api", phase("Pending"));
        pods.upsert(pod("static", crate::source::FILE_SOURCE));
        status.set("u-static", phase("Running"));
        let mut going = pod("going", crate::source::API_SOURCE);
        going.metadata.deletion_timestamp = Some(crate::testutil::epoch());
        pods.mark_terminating(going);

        let list = pod_list(&pods, &status);
        let items = list["items"].as_array().unwrap();
        let names: Vec<&str> = items
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["api", "going", "static"]);
        assert_eq!(items[0]["status"]["phase"], "Running", "the API's copy");
        assert_eq!(
            items[0]["status"]["conditions"][0]["type"],
            "example.com/lb"
        );
        assert!(items[1]["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(
            items[2]["status"]["phase"], "Running",
            "the status manager's"
        );
    }

    #[test]
    fn healthz_speaks_upstreams_format() {
        let slis = crate::metrics::slis::Slis::default();
        let healthz_body =
            |c: &[(&'static str, Result<(), String>)], q: &str| healthz_body(c, q, &slis);
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
        // Verbose too: the reason is withheld (upstream's handleRootHealth
        // writes it to the log only; the endpoint is public).
        let (_, body) = healthz_body(&down(), "verbose");
        assert!(
            body.contains("[-]runtime failed: reason withheld\n"),
            "{body}"
        );
        assert!(!body.contains("is down"), "{body}");
        let (code, body) = healthz_body(&down(), "exclude=runtime");
        assert_eq!(code, StatusCode::OK, "{body}");
        // Each check run was recorded (`exclude` leaves one out), as
        // upstream's handler observes its SLIs.
        let text = slis.text();
        for (check, status, n) in [
            ("ping", "success", 5),
            ("runtime", "success", 2),
            ("runtime", "error", 2),
        ] {
            let line = format!(
                "kubernetes_healthchecks_total{{name=\"{check}\",status=\"{status}\",type=\"healthz\"}} {n}\n"
            );
            assert!(text.contains(&line), "{line}{text}");
        }
        assert!(text.contains("kubernetes_healthcheck{name=\"runtime\",type=\"healthz\"} 0\n"));
        // An exclude that matches no check is warned of.
        let (code, body) = healthz_body(&checks(Ok(())), "verbose&exclude=nope&exclude=log");
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "[+]ping ok\n[+]log excluded: ok\n[+]syncloop ok\n[+]pleg ok\n[+]runtime ok\nwarn: some health checks cannot be excluded: no matches for \"nope\"\nhealthz check passed\n"
        );
        // Several, joined as upstream's formatQuoted joins them.
        let (_, body) = healthz_body(&checks(Ok(())), "exclude=b&exclude=a&verbose");
        assert!(body.contains("no matches for \"a\",\"b\"\n"), "{body}");
    }

    async fn get_json(router: Router, path: &str) -> (StatusCode, serde_json::Value) {
        let (code, body) = call(router, "GET", path, "").await;
        (code, serde_json::from_str(&body).unwrap_or_default())
    }

    #[tokio::test]
    async fn configz_and_runningpods_answer_as_upstream() {
        let fake = Arc::new(crate::cri::fake::FakeRuntime::new());
        fake.run_labelled("ns", "web", "u1", "app").await;
        let (state, token) = ServerState::for_tests(fake);
        let router = default_routes()
            .merge(debugging_routes(&state.config))
            .with_state(state);

        let (code, v) = get_json(router.clone(), "/configz").await;
        assert_eq!(code, StatusCode::OK);
        let c = &v["kubeletconfig"];
        assert_eq!(c["syncFrequency"], "1m0s", "{v}");
        assert_eq!(c["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert!(c.get("kind").is_none(), "upstream's configz has no kind");
        // Go's float form: 0.9, and a whole number without ".0".
        assert_eq!(c["memoryThrottlingFactor"], 0.9);
        let whole = crate::config::KubeletConfiguration {
            memory_throttling_factor: 1.0,
            ..Default::default()
        };
        let text = serde_json::to_string(&whole).unwrap();
        assert!(text.contains("\"memoryThrottlingFactor\":1,"), "{text}");
        // Any method, as component-base's handler; HTML characters escaped.
        let (code, _) = call(router.clone(), "POST", "/configz", "").await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            go_html_escaped(br#"{"u":"http://a/?x=1&y=<2>"}"#.to_vec()),
            br#"{"u":"http://a/?x=1\u0026y=\u003c2\u003e"}"#.to_vec()
        );

        let (code, v) = get_json(router, "/runningpods/").await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(v["kind"], "PodList");
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{v}");
        assert_eq!(items[0]["metadata"]["name"], "web");
        assert_eq!(items[0]["metadata"]["namespace"], "ns");
        assert_eq!(items[0]["metadata"]["uid"], "u1");
        assert_eq!(items[0]["spec"]["containers"][0]["name"], "app");
        assert_eq!(items[0]["spec"]["containers"][0]["image"], "busybox");
        token.cancel();
    }

    async fn call(router: Router, method: &str, path: &str, body: &str) -> (StatusCode, String) {
        use tower::ServiceExt;
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let resp = router.oneshot(req).await.unwrap();
        let code = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (code, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Upstream's `InstallDebuggingDisabledHandlers` (the read-only port,
    /// and :10250 without `enableDebuggingHandlers`) and the switches under
    /// it: a 405 with Go's `http.Error` text, where rkubelet said 404.
    #[tokio::test]
    async fn debugging_endpoints_that_are_not_served_refuse_as_upstream() {
        let fake = Arc::new(crate::cri::fake::FakeRuntime::new());
        let (state, token) = ServerState::for_tests(fake);
        let ro = read_only_router(state.clone());
        for path in [
            "/exec/ns/pod/c",
            "/run/ns/pod/c",
            "/attach/ns/pod/c",
            "/portForward/ns/pod",
            "/containerLogs/ns/pod/c",
            "/runningpods/",
            "/debug/pprof/heap",
            "/logs/",
            "/logs/syslog",
        ] {
            let (code, body) = call(ro.clone(), "POST", path, "").await;
            assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED, "{path}");
            assert_eq!(body, "Debug endpoints are disabled.\n", "{path}");
        }
        // Not among them: unknown, as upstream's mux.
        assert_eq!(
            call(ro.clone(), "GET", "/configz", "").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            call(ro, "PUT", "/debug/flags/v", "4").await.0,
            StatusCode::NOT_FOUND
        );

        let mut cfg = (*state.config).clone();
        cfg.enable_system_log_handler = false;
        cfg.enable_profiling_handler = false;
        cfg.enable_debug_flags_handler = false;
        let off = ServerState {
            config: Arc::new(cfg),
            ..state.clone()
        };
        let r = default_routes()
            .merge(debugging_routes(&off.config))
            .with_state(off);
        for (path, msg) in [
            ("/logs/", "logs endpoint is disabled.\n"),
            ("/logs/syslog", "logs endpoint is disabled.\n"),
            ("/debug/pprof/", "profiling endpoint is disabled.\n"),
            ("/debug/flags/v", "flags endpoint is disabled.\n"),
        ] {
            let (code, body) = call(r.clone(), "GET", path, "").await;
            assert_eq!(
                (code, body.as_str()),
                (StatusCode::METHOD_NOT_ALLOWED, msg),
                "{path}"
            );
        }
        token.cancel();
    }

    /// Go's ServeMux runs before the authentication filter: an unknown
    /// path is `404 page not found` to anyone (it was a 401), a subtree
    /// root without its slash a 301; a path under a registered prefix
    /// that no route takes is authenticated first, then go-restful's 404.
    #[tokio::test]
    async fn unknown_paths_are_not_found_before_authentication() {
        let fake = Arc::new(crate::cri::fake::FakeRuntime::new());
        let (state, token) = ServerState::for_tests(fake);
        let cfg = crate::testutil::kubelet_config(
            "enableDebuggingHandlers: true\nauthentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\nauthorization:\n  mode: Webhook\n",
        );
        let api = Arc::new(std::sync::OnceLock::new());
        let auth = auth::Auth::new(&cfg, "node", None, true, api).unwrap();
        let state = ServerState {
            config: Arc::new(cfg),
            ..state
        };
        let r = api_router(state.clone(), auth);
        for path in ["/nope", "/spec", "/metrics/nope", "/healthz/nope", "/"] {
            assert_eq!(
                call(r.clone(), "GET", path, "").await,
                (StatusCode::NOT_FOUND, "404 page not found\n".into()),
                "{path}"
            );
        }
        for path in ["/pods", "/stats/summary", "/logs/", "/pods/extra"] {
            assert_eq!(
                call(r.clone(), "GET", path, "").await,
                (StatusCode::UNAUTHORIZED, "Unauthorized".into()),
                "{path}"
            );
        }
        use tower::ServiceExt;
        let req = axum::http::Request::get("/logs?x=1")
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = r.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
        assert_eq!(resp.headers()[header::LOCATION], "/logs/?x=1");
        let (code, _) = call(r, "GET", "/pods/../stats/summary", "").await;
        assert_eq!(code, StatusCode::MOVED_PERMANENTLY);
        // The read-only port: no authentication, go-restful's 404 under a
        // registered prefix, Go's elsewhere.
        let ro = read_only_router(state);
        assert_eq!(
            call(ro.clone(), "GET", "/pods/extra", "").await,
            (StatusCode::NOT_FOUND, "404: Page Not Found".into())
        );
        assert_eq!(
            call(ro.clone(), "GET", "/spec/", "").await,
            (StatusCode::NOT_FOUND, "404 page not found\n".into())
        );
        // healthz takes any method, as upstream's mux.Handle (it was 405).
        assert_eq!(
            call(ro.clone(), "POST", "/healthz", "").await,
            call(ro, "GET", "/healthz", "").await
        );
        token.cancel();
    }

    /// `PUT /debug/flags/v` changes the log verbosity as upstream's
    /// `StringFlagPutHandler(logs.GlogSetter)` does, and answers as it does.
    #[tokio::test]
    // The lock serialises the tests that change the process-wide verbosity
    // (a current-thread runtime: nothing else runs on it meanwhile).
    #[allow(clippy::await_holding_lock)]
    async fn debug_flags_v_sets_the_verbosity() {
        let _g = crate::logging::TEST_LOCK.lock();
        let fake = Arc::new(crate::cri::fake::FakeRuntime::new());
        let (state, token) = ServerState::for_tests(fake);
        let r = default_routes()
            .merge(debugging_routes(&state.config))
            .with_state(state);
        let before = crate::logging::verbosity();
        assert_eq!(
            call(r.clone(), "GET", "/debug/flags/v", "").await,
            (
                StatusCode::NOT_ACCEPTABLE,
                "unsupported http method\n".into()
            )
        );
        assert_eq!(
            call(r.clone(), "PUT", "/debug/flags/v", "x").await,
            (
                StatusCode::BAD_REQUEST,
                "strconv.ParseUint: parsing \"x\": invalid syntax\n".into()
            )
        );
        assert_eq!(crate::logging::verbosity(), before);
        assert_eq!(
            call(r.clone(), "PUT", "/debug/flags/v", "5").await,
            (
                StatusCode::OK,
                "successfully set klog.logging.verbosity to 5\n".into()
            )
        );
        assert_eq!(crate::logging::verbosity(), 5);
        crate::logging::set_verbosity(before);
        token.cancel();
    }
}
