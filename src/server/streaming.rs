//! Streaming: `/exec`, `/attach`, `/portForward`, `/run`, proxied to the
//! runtime's streaming server (upstream `pkg/kubelet/server/server.go`
//! getExec/getAttach/getPortForward/getRun and its `proxyStream`, which
//! is apimachinery's `UpgradeAwareHandler` with upgrades required).
//!
//! The kubelet asks the runtime (CRI Exec/Attach/PortForward) for a
//! one-time URL on its streaming server, forwards the client's upgrade
//! request there, relays the answer and, on `101 Switching Protocols`,
//! splices the two upgraded connections byte for byte. The kubelet never
//! parses SPDY or WebSocket frames, so every protocol the runtime speaks
//! (SPDY/3.1, `v4`/`v5.channel.k8s.io`, `portforward.k8s.io`) passes.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::Instrument;

use crate::cri::{v1, CriError, RuntimeService};
use crate::kuberuntime::labels;
use crate::server::ServerState;

/// Query parameter names the kubelet reads (k8s.io/api core/v1
/// `ExecStdinParam` etc.): the API server turns `PodExecOptions`'
/// stdin/stdout/stderr/tty into `input`/`output`/`error`/`tty` = "1".
const PARAM_STDIN: &str = "input";
const PARAM_STDOUT: &str = "output";
const PARAM_STDERR: &str = "error";
const PARAM_TTY: &str = "tty";
const PARAM_COMMAND: &str = "command";
const PARAM_PORT: &str = "port";

/// Bound on dialling the runtime's streaming server and reading its answer's
/// head, so a runtime that never answers does not hold the handler.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Size of each direction's splice buffer.
const SPLICE_BUF: usize = 32 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    BadRequest(String),
    #[error("pod does not exist")]
    PodNotFound,
    /// Upstream's getPortForward: a UID that does not match.
    #[error("pod not found")]
    PodUidMismatch,
    /// Upstream's GetExec/GetAttach: a plain error, so a 500 as upstream.
    #[error("container not found ({0:?})")]
    ContainerNotFound(String),
    /// Upstream's GetAttach: running, but not in the pod's spec (a 500).
    #[error("container {container} not found in pod {pod}")]
    ContainerNotInPod { container: String, pod: String },
    /// Upstream's GetAttach: a UID in the path that is not the pod's (a
    /// 500, unlike port-forward's 404).
    #[error("pod {0} not found")]
    PodNotFoundByUid(String),
    #[error("pod not found ({0:?})")]
    SandboxNotFound(String),
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("Upgrade request required")]
    UpgradeRequired,
    #[error("invalid streaming URL {url:?} from the runtime: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("error dialing backend: {0}")]
    Dial(String),
}

impl IntoResponse for StreamError {
    fn into_response(self) -> Response {
        let code = match &self {
            StreamError::BadRequest(_) => StatusCode::BAD_REQUEST,
            StreamError::PodNotFound | StreamError::PodUidMismatch => StatusCode::NOT_FOUND,
            // Upstream's streaming.WriteError: the gRPC code decides.
            StreamError::Cri(CriError::NotFound { .. }) => StatusCode::NOT_FOUND,
            StreamError::Cri(CriError::Status {
                code: tonic::Code::ResourceExhausted,
                ..
            }) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if code.is_server_error() {
            tracing::warn!(error = %self, "streaming request failed");
        }
        // The runtime's error as Go prints a gRPC status, which is what
        // upstream writes (streaming.WriteError).
        let text = match &self {
            StreamError::Cri(e) => e.grpc_text(),
            e => e.to_string(),
        };
        let mut r = (code, text).into_response();
        if code == StatusCode::TOO_MANY_REQUESTS {
            // The streaming request cache's TTL, which upstream asks the
            // client to wait out.
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
        }
        r
    }
}

/// Which streams a remote command wants (upstream remotecommand
/// `NewOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

fn first<'a>(query: &'a [(String, String)], key: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// As upstream: a stream is on only for the value "1"; a TTY drops stderr
/// (it is merged into the terminal); at least one stream is required.
pub fn parse_stream_options(query: &[(String, String)]) -> Result<StreamOptions, StreamError> {
    let on = |k| first(query, k) == Some("1");
    let mut o = StreamOptions {
        stdin: on(PARAM_STDIN),
        stdout: on(PARAM_STDOUT),
        stderr: on(PARAM_STDERR),
        tty: on(PARAM_TTY),
    };
    if o.tty && o.stderr {
        o.stderr = false;
    }
    if !o.stdin && !o.stdout && !o.stderr {
        return Err(StreamError::BadRequest(
            "you must specify at least 1 of stdin, stdout, stderr".into(),
        ));
    }
    Ok(o)
}

/// The `command` parameters, in order.
pub fn parse_command(query: &[(String, String)]) -> Vec<String> {
    query
        .iter()
        .filter(|(k, _)| k == PARAM_COMMAND)
        .map(|(_, v)| v.clone())
        .collect()
}

/// Upstream portforward `NewV4Options`: ports are read (and required) only
/// for WebSocket requests; SPDY clients name ports per stream instead.
pub fn parse_ports(query: &[(String, String)], websocket: bool) -> Result<Vec<i32>, StreamError> {
    if !websocket {
        return Ok(Vec::new());
    }
    let values: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == PARAM_PORT)
        .map(|(_, v)| v.as_str())
        .collect();
    if values.is_empty() {
        return Err(StreamError::BadRequest(format!(
            "query parameter {PARAM_PORT:?} is required"
        )));
    }
    let mut ports = Vec::new();
    for v in values {
        if v.is_empty() {
            return Err(StreamError::BadRequest(format!(
                "query parameter {PARAM_PORT:?} cannot be empty"
            )));
        }
        for p in v.split(',') {
            let port: u16 = p.parse().map_err(|e| {
                StreamError::BadRequest(format!("unable to parse {v:?} as a port: {e}"))
            })?;
            if port < 1 {
                return Err(StreamError::BadRequest(format!("port {v:?} must be > 0")));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

fn header_has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// httpstream.IsUpgradeRequest: `Connection` names `upgrade`.
fn is_upgrade_request(headers: &HeaderMap) -> bool {
    header_has_token(headers, header::CONNECTION, "upgrade")
}

/// wsstream.IsWebSocketRequest.
fn is_websocket_request(headers: &HeaderMap) -> bool {
    is_upgrade_request(headers) && header_has_token(headers, header::UPGRADE, "websocket")
}

/// The pod by namespace and name (upstream GetPodByName over the pod
/// manager, so a pod in its grace period too); a UID in the path must
/// match it.
pub(super) fn find_pod(
    s: &ServerState,
    namespace: &str,
    name: &str,
) -> Result<std::sync::Arc<k8s_openapi::api::core::v1::Pod>, StreamError> {
    s.pods
        .by_name(namespace, name)
        .ok_or(StreamError::PodNotFound)
}

/// The running container `container` of the pod with `uid`, newest first
/// (upstream findContainer over the runtime's running pods).
pub(super) async fn find_container(
    runtime: &dyn RuntimeService,
    uid: &str,
    container: &str,
) -> Result<String, StreamError> {
    let filter = v1::ContainerFilter {
        state: Some(v1::ContainerStateValue {
            state: v1::ContainerState::ContainerRunning as i32,
        }),
        label_selector: labels::container_selector(uid, container),
        ..Default::default()
    };
    runtime
        .list_containers(Some(filter))
        .await?
        .into_iter()
        // The filter is the runtime's to honour; check again.
        .filter(|c| c.state == v1::ContainerState::ContainerRunning as i32)
        .max_by_key(|c| c.created_at)
        .map(|c| c.id)
        .ok_or_else(|| StreamError::ContainerNotFound(container.to_string()))
}

/// The pod's ready sandbox (upstream getSandboxIDByPodUID, newest first).
async fn find_sandbox(
    runtime: &dyn RuntimeService,
    uid: &str,
    full_name: &str,
) -> Result<String, StreamError> {
    let filter = v1::PodSandboxFilter {
        state: Some(v1::PodSandboxStateValue {
            state: v1::PodSandboxState::SandboxReady as i32,
        }),
        label_selector: labels::pod_selector(uid),
        ..Default::default()
    };
    runtime
        .list_pod_sandbox(Some(filter))
        .await?
        .into_iter()
        .filter(|s| s.state == v1::PodSandboxState::SandboxReady as i32)
        .max_by_key(|s| s.created_at)
        .map(|s| s.id)
        .ok_or_else(|| StreamError::SandboxNotFound(full_name.to_string()))
}

/// Path parameters shared by the routes: `podNamespace`, `podID`, and the
/// optional `uid` and `containerName`.
struct Target {
    namespace: String,
    pod: String,
    uid: Option<String>,
    container: String,
}

impl Target {
    fn from(mut p: HashMap<String, String>) -> Self {
        Target {
            namespace: p.remove("podNamespace").unwrap_or_default(),
            pod: p.remove("podID").unwrap_or_default(),
            uid: p.remove("uid").filter(|u| !u.is_empty()),
            container: p.remove("containerName").unwrap_or_default(),
        }
    }

    /// The pod, and the UID to look the runtime up by: the path's if given
    /// (upstream's FindPod prefers it), else the pod's.
    fn resolve(
        &self,
        s: &ServerState,
    ) -> Result<(std::sync::Arc<k8s_openapi::api::core::v1::Pod>, String), StreamError> {
        let pod = find_pod(s, &self.namespace, &self.pod)?;
        let uid = match &self.uid {
            Some(u) => u.clone(),
            None => crate::source::pod_uid(&pod).to_string(),
        };
        Ok((pod, uid))
    }
}

async fn exec(
    State(s): State<ServerState>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let t = Target::from(p);
    let r = async {
        let opts = parse_stream_options(&q)?;
        let (_pod, uid) = t.resolve(&s)?;
        let id = find_container(&*s.runtime, &uid, &t.container).await?;
        let url = s
            .runtime
            .exec(v1::ExecRequest {
                container_id: id,
                cmd: parse_command(&q),
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            })
            .await?;
        Ok::<_, StreamError>(url)
    }
    .await;
    match r {
        Ok(url) => proxy_stream(&s, "exec", &t, &url, req).await,
        Err(e) => e.into_response(),
    }
}

async fn attach(
    State(s): State<ServerState>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let t = Target::from(p);
    let r = async {
        let opts = parse_stream_options(&q)?;
        let (pod, uid) = t.resolve(&s)?;
        let full_name = crate::source::pod_full_name(&pod);
        let id = find_container(&*s.runtime, &uid, &t.container).await?;
        if t.uid.is_some() && uid != crate::source::pod_uid(&pod) {
            return Err(StreamError::PodNotFoundByUid(full_name));
        }
        // As upstream: attach's TTY is the container's own (it cannot change
        // after the process started), not the request's; init and
        // ephemeral containers are searched too (GetContainerSpec).
        let sp = pod.spec.as_ref();
        let regular = sp.into_iter().flat_map(|sp| {
            let inits = sp.init_containers.iter().flatten();
            sp.containers.iter().chain(inits).map(|c| (&c.name, c.tty))
        });
        let ephemeral = sp
            .into_iter()
            .flat_map(|sp| sp.ephemeral_containers.iter().flatten())
            .map(|c| (&c.name, c.tty));
        let tty = regular
            .chain(ephemeral)
            .find(|(n, _)| **n == t.container)
            .ok_or_else(|| StreamError::ContainerNotInPod {
                container: t.container.clone(),
                pod: full_name.clone(),
            })?
            .1
            .unwrap_or(false);
        let url = s
            .runtime
            .attach(v1::AttachRequest {
                container_id: id,
                stdin: opts.stdin,
                tty,
                stdout: opts.stdout,
                // As asked: a runtime refuses stderr beside a TTY, and that
                // refusal is the answer, as upstream passes it on.
                stderr: opts.stderr,
            })
            .await?;
        Ok::<_, StreamError>(url)
    }
    .await;
    match r {
        Ok(url) => proxy_stream(&s, "attach", &t, &url, req).await,
        Err(e) => e.into_response(),
    }
}

async fn port_forward(
    State(s): State<ServerState>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let t = Target::from(p);
    // Read before the await: the request's body is not Sync.
    let websocket = is_websocket_request(req.headers());
    let r = async {
        let ports = parse_ports(&q, websocket)?;
        let pod = find_pod(&s, &t.namespace, &t.pod)?;
        let uid = crate::source::pod_uid(&pod).to_string();
        if t.uid.as_ref().is_some_and(|u| *u != uid) {
            return Err(StreamError::PodUidMismatch);
        }
        let full_name = crate::source::pod_full_name(&pod);
        let sandbox = find_sandbox(&*s.runtime, &uid, &full_name).await?;
        let url = s
            .runtime
            .port_forward(v1::PortForwardRequest {
                pod_sandbox_id: sandbox,
                port: ports,
            })
            .await?;
        Ok::<_, StreamError>(url)
    }
    .await;
    match r {
        Ok(url) => proxy_stream(&s, "portforward", &t, &url, req).await,
        Err(e) => e.into_response(),
    }
}

/// `/run`: ExecSync of `cmd` (split on spaces, as upstream's legacy
/// parameter), answering stdout then stderr; a failure or non-zero exit
/// is a 500 with the error text.
async fn run(
    State(s): State<ServerState>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let t = Target::from(p);
    let form = match form_body(req).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let r = async {
        let (_pod, uid) = t.resolve(&s)?;
        // go-restful's QueryParameter is Go's FormValue: a form body's
        // value before the query's.
        let cmd: Vec<String> = first(&form, "cmd")
            .or_else(|| first(&q, "cmd"))
            .unwrap_or_default()
            .split(' ')
            .map(str::to_string)
            .collect();
        let id = find_container(&*s.runtime, &uid, &t.container).await?;
        let resp = s.runtime.exec_sync(&id, cmd.clone(), 0).await?;
        Ok::<_, StreamError>((cmd, resp))
    }
    .await;
    match r {
        Ok((cmd, resp)) if resp.exit_code != 0 => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command '{}' exited with {}: {}",
                cmd.join(" "),
                resp.exit_code,
                String::from_utf8_lossy(&resp.stderr)
            ),
        )
            .into_response(),
        Ok((_, resp)) => {
            let mut out = resp.stdout;
            out.extend_from_slice(&resp.stderr);
            if out.is_empty() {
                return StatusCode::OK.into_response();
            }
            ([(header::CONTENT_TYPE, "application/json")], out).into_response()
        }
        Err(StreamError::PodNotFound) => StreamError::PodNotFound.into_response(),
        Err(e @ StreamError::BadRequest(_)) => e.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The largest form body read (Go's ParseForm reads up to 10 MB; a
/// command line is far smaller, and a bigger body costs memory for nothing).
const MAX_FORM_BODY: usize = 64 << 10;

/// The fields of an `application/x-www-form-urlencoded` body (Go's
/// ParseForm reads one for POST); none for another content type. A body
/// over `MAX_FORM_BODY` is a 413.
async fn form_body(req: Request) -> Result<Vec<(String, String)>, Response> {
    let is_form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            m.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !is_form {
        return Ok(Vec::new());
    }
    let body = axum::body::to_bytes(req.into_body(), MAX_FORM_BODY)
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("form body over {MAX_FORM_BODY} bytes"),
            )
                .into_response()
        })?;
    Ok(url::form_urlencoded::parse(&body).into_owned().collect())
}

/// The runtime's URL as host:port and origin-form path. A relative URL
/// (no authority) cannot be dialled: containerd answers absolute ones.
fn backend_target(url: &str) -> Result<(String, String), StreamError> {
    let bad = |reason: &str| StreamError::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: axum::http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => return Err(bad(&format!("scheme {other:?} is not supported"))),
        None => return Err(bad("not an absolute URL")),
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    let hostport = match authority.port_u16() {
        Some(_) => authority.as_str().to_string(),
        None => format!("{}:80", authority.host()),
    };
    // As UpgradeAwareHandler's upgrade path: the runtime's location as it
    // is (the client's query only replaces it on the non-upgrade path,
    // which streaming never takes).
    let path = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    Ok((hostport, path))
}

/// UpgradeAwareHandler with upgrades required: forward the client's
/// upgrade request to `url`, relay the answer, and on 101 splice.
async fn proxy_stream(
    s: &ServerState,
    kind: &'static str,
    t: &Target,
    url: &str,
    mut req: Request,
) -> Response {
    if !is_upgrade_request(req.headers()) {
        return StreamError::UpgradeRequired.into_response();
    }
    let (hostport, path) = match backend_target(url) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let client_upgrade = hyper::upgrade::on(&mut req);
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip().to_string());

    let mut fwd = axum::http::Request::builder()
        .method(req.method().clone())
        .uri(path.as_str());
    let xff = header::HeaderName::from_static("x-forwarded-for");
    for (k, v) in req.headers() {
        // The upgrade request carries no body; its framing headers go.
        // X-Forwarded-For is set anew below when the client is known.
        if k != header::HOST
            && k != header::CONTENT_LENGTH
            && k != header::TRANSFER_ENCODING
            && !(k == xff && peer.is_some())
        {
            fwd = fwd.header(k, v);
        }
    }
    fwd = fwd.header(header::HOST, hostport.as_str());
    if let Some(ip) = peer {
        // AppendForwardedForHeader: one header, the prior hops (every
        // value given, joined) and then the client's address.
        let mut hops: Vec<&str> = req
            .headers()
            .get_all(&xff)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        hops.push(&ip);
        if let Ok(v) = HeaderValue::from_str(&hops.join(", ")) {
            fwd = fwd.header(xff, v);
        }
    }
    let fwd = match fwd.body(Body::empty()) {
        Ok(r) => r,
        Err(e) => return StreamError::Dial(e.to_string()).into_response(),
    };

    let span = tracing::info_span!(
        "stream",
        kind,
        namespace = %t.namespace,
        pod = %t.pod,
        container = %t.container,
        backend = %hostport,
    );
    let backend = async {
        let tcp = tokio::net::TcpStream::connect(&hostport)
            .await
            .map_err(|e| StreamError::Dial(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| StreamError::Dial(e.to_string()))?;
        // Ends with the connection: after the upgrade, or when a plain
        // answer's body has been read; bounded for a runtime gone silent.
        tokio::spawn(async move {
            let _ = tokio::time::timeout(2 * BACKEND_TIMEOUT, conn.with_upgrades()).await;
        });
        sender
            .send_request(fwd)
            .await
            .map_err(|e| StreamError::Dial(e.to_string()))
    }
    .instrument(span.clone());
    let mut resp = match tokio::time::timeout(BACKEND_TIMEOUT, backend).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => return StreamError::Dial("timed out".into()).into_response(),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS && resp.status().as_u16() < 400 {
        // UpgradeAwareHandler: only an error is relayed; anything else
        // that is not an upgrade is the proxy's error.
        let e = format!(
            "invalid upgrade response: status code {}",
            resp.status().as_u16()
        );
        tracing::warn!(parent: &span, "{e}");
        return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response();
    }
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // A refused upgrade is relayed as it is (status, headers, body).
        tracing::debug!(parent: &span, status = %resp.status(), "runtime did not upgrade");
        return resp.map(Body::new);
    }
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    let idle = Duration::from(s.config.streaming_connection_idle_timeout);
    let task_span = span.clone();
    let stop = s.streams.token.clone();
    s.streams.tracker.spawn(
        async move {
            let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "upgrade failed");
                    return;
                }
            };
            tracing::debug!("spliced");
            tokio::select! {
                // Shutdown: both connections drop with this task.
                _ = stop.cancelled() => tracing::debug!("stream ended at shutdown"),
                r = splice(TokioIo::new(client), TokioIo::new(backend), idle) => match r {
                    Ok((up, down)) => tracing::debug!(up, down, "stream closed"),
                    Err(e) => tracing::debug!(error = %e, "stream ended"),
                },
            }
        }
        .instrument(task_span),
    );
    let mut out = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        out = out.header(k, v);
    }
    out.body(Body::empty())
        .unwrap_or_else(|e| StreamError::Dial(e.to_string()).into_response())
}

/// Copies both ways until either side ends, then closes both, as upstream's
/// UpgradeAwareHandler (tryUpgrade waits for one half and closes the two
/// connections): a client that never closes cannot hold a finished stream
/// open. With a non-zero `idle`, a connection that moves no byte that long
/// (or whose peer stops reading that long) is closed: the kubelet's
/// `streamingConnectionIdleTimeout`.
pub async fn splice<A, B>(a: A, b: B, idle: Duration) -> std::io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let mut buf_a = vec![0u8; SPLICE_BUF];
    let mut buf_b = vec![0u8; SPLICE_BUF];
    let (mut up, mut down) = (0u64, 0u64);
    let idle = if idle.is_zero() {
        // Zero disables the limit; a century stands in for "never".
        Duration::from_secs(100 * 365 * 24 * 3600)
    } else {
        idle
    };
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "idle timeout");
    loop {
        tokio::select! {
            r = ar.read(&mut buf_a) => {
                let n = r?;
                if n == 0 {
                    // Both halves drop on return; the other side's
                    // shutdown flushes what was written to it.
                    let _ = bw.shutdown().await;
                    return Ok((up, down));
                } else {
                    tokio::time::timeout(idle, bw.write_all(&buf_a[..n])).await.map_err(|_| timed_out())??;
                    up += n as u64;
                }
            }
            r = br.read(&mut buf_b) => {
                let n = r?;
                if n == 0 {
                    let _ = aw.shutdown().await;
                    return Ok((up, down));
                } else {
                    tokio::time::timeout(idle, aw.write_all(&buf_b[..n])).await.map_err(|_| timed_out())??;
                    down += n as u64;
                }
            }
            _ = tokio::time::sleep(idle) => return Err(timed_out()),
        }
    }
}

/// GET and POST only: axum's `get` answers HEAD too, which upstream's
/// routes refuse (405) rather than open a stream for.
fn get_or_post<H, T>(h: H) -> axum::routing::MethodRouter<ServerState>
where
    H: axum::handler::Handler<T, ServerState>,
    T: 'static,
{
    axum::routing::on(
        axum::routing::MethodFilter::GET.or(axum::routing::MethodFilter::POST),
        h,
    )
    // A GET route serves HEAD unless HEAD has its own handler.
    .head(|| async { StatusCode::METHOD_NOT_ALLOWED })
}

/// `/exec/...`, `/attach/...`, `/portForward/...`, `/run/...`.
pub fn routes() -> Router<ServerState> {
    Router::new()
        .route(
            "/exec/{podNamespace}/{podID}/{containerName}",
            get_or_post(exec),
        )
        .route(
            "/exec/{podNamespace}/{podID}/{uid}/{containerName}",
            get_or_post(exec),
        )
        .route(
            "/attach/{podNamespace}/{podID}/{containerName}",
            get_or_post(attach),
        )
        .route(
            "/attach/{podNamespace}/{podID}/{uid}/{containerName}",
            get_or_post(attach),
        )
        .route(
            "/portForward/{podNamespace}/{podID}",
            get_or_post(port_forward),
        )
        .route(
            "/portForward/{podNamespace}/{podID}/{uid}",
            get_or_post(port_forward),
        )
        .route("/run/{podNamespace}/{podID}/{containerName}", post(run))
        .route(
            "/run/{podNamespace}/{podID}/{uid}/{containerName}",
            post(run),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use k8s_openapi::api::core::v1::{Container, Pod};
    use std::sync::Arc;
    use tower::ServiceExt;

    fn q(s: &str) -> Vec<(String, String)> {
        s.split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    #[test]
    fn stream_options_as_upstream() {
        let o = parse_stream_options(&q("input=1&output=1&error=1")).unwrap();
        assert_eq!(
            o,
            StreamOptions {
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false
            }
        );
        // A TTY merges stderr into the terminal.
        let o = parse_stream_options(&q("output=1&error=1&tty=1")).unwrap();
        assert!(o.tty && o.stdout && !o.stderr);
        // Only "1" turns a stream on; the API server's names are not read.
        assert!(parse_stream_options(&q("input=true&output=true")).is_err());
        assert!(parse_stream_options(&q("stdin=1&stdout=1")).is_err());
        assert!(parse_stream_options(&q("tty=1")).is_err());
        assert_eq!(
            parse_command(&q("command=sh&output=1&command=-c&command=echo")),
            ["sh", "-c", "echo"]
        );
    }

    #[test]
    fn ports_as_upstream() {
        assert_eq!(parse_ports(&q(""), false).unwrap(), Vec::<i32>::new());
        assert!(parse_ports(&q(""), true).is_err());
        assert!(parse_ports(&q("port="), true).is_err());
        assert!(parse_ports(&q("port=0"), true).is_err());
        assert!(parse_ports(&q("port=70000"), true).is_err());
        assert_eq!(
            parse_ports(&q("port=80,8080&port=9"), true).unwrap(),
            [80, 8080, 9]
        );
    }

    #[test]
    fn backend_url() {
        assert_eq!(
            backend_target("http://127.0.0.1:4321/exec/abc?a=1").unwrap(),
            ("127.0.0.1:4321".into(), "/exec/abc?a=1".into())
        );
        assert_eq!(
            backend_target("http://[::1]/exec/abc").unwrap(),
            ("[::1]:80".into(), "/exec/abc".into())
        );
        assert!(backend_target("/exec/abc").is_err());
        assert!(backend_target("https://127.0.0.1:1/exec/abc").is_err());
    }

    /// A state with pod default/web (uid "u1"), its sandbox and a running
    /// container "app".
    async fn state() -> (
        ServerState,
        Arc<FakeRuntime>,
        tokio_util::sync::CancellationToken,
    ) {
        let rt = Arc::new(FakeRuntime::new());
        let (s, token) = ServerState::for_tests(rt.clone());
        let mut pod = crate::testutil::pod("Always", &[], &["app"]);
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("u1".into());
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        run_in(&rt, &pod, &c).await;
        s.pods.upsert(pod);
        rt.clear_calls();
        (s, rt, token)
    }

    /// Runs container `c` of `pod` in a sandbox of its own on the fake;
    /// its runtime ID.
    async fn run_in(rt: &FakeRuntime, pod: &Pod, c: &Container) -> String {
        let sb = v1::PodSandboxConfig {
            labels: labels::sandbox_labels(pod),
            ..Default::default()
        };
        let sb_id = rt.run_pod_sandbox(sb.clone(), String::new()).await.unwrap();
        let cfg = v1::ContainerConfig {
            metadata: Some(v1::ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            labels: labels::container_labels(pod, c, false),
            ..Default::default()
        };
        let id = rt.create_container(&sb_id, cfg, sb).await.unwrap();
        rt.start_container(&id).await.unwrap();
        id
    }

    async fn call(s: &ServerState, method: &str, uri: &str, upgrade: bool) -> (StatusCode, String) {
        let mut b = axum::http::Request::builder().method(method).uri(uri);
        if upgrade {
            b = b
                .header("connection", "Upgrade")
                .header("upgrade", "websocket");
        }
        let resp = routes()
            .with_state(s.clone())
            .oneshot(b.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let code = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    /// The upgrade request reaches the runtime with the client's address
    /// appended to X-Forwarded-For (apimachinery's AppendForwardedForHeader,
    /// called by UpgradeAwareHandler), and a refused upgrade is relayed.
    #[tokio::test]
    async fn the_runtime_is_told_who_the_client_is() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (s, rt, _t) = state().await;
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        rt.set_stream_base(&format!("http://{}", backend.local_addr().unwrap()));
        let heads = tokio::spawn(async move {
            let mut heads = Vec::new();
            for _ in 0..2 {
                let (mut c, _) = backend.accept().await.unwrap();
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    let n = c.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the request head ended early");
                    head.extend_from_slice(&buf[..n]);
                }
                c.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno")
                    .await
                    .unwrap();
                heads.push(String::from_utf8(head).unwrap().to_ascii_lowercase());
            }
            heads
        });
        let client: std::net::SocketAddr = "192.0.2.7:40000".parse().unwrap();
        for prior in [None, Some("10.0.0.1")] {
            let mut b = axum::http::Request::get("/exec/default/web/app?output=1&command=ls")
                .header("connection", "Upgrade")
                .header("upgrade", "websocket");
            if let Some(p) = prior {
                b = b.header("x-forwarded-for", p);
            }
            let mut req = b.body(Body::empty()).unwrap();
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(client));
            let resp = routes().with_state(s.clone()).oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        }
        let heads = heads.await.unwrap();
        assert!(
            heads[0].contains("\r\nx-forwarded-for: 192.0.2.7\r\n"),
            "{}",
            heads[0]
        );
        assert!(
            heads[1].contains("\r\nx-forwarded-for: 10.0.0.1, 192.0.2.7\r\n"),
            "{}",
            heads[1]
        );
        assert_eq!(
            heads[1].matches("x-forwarded-for").count(),
            1,
            "{}",
            heads[1]
        );
    }

    /// Attach finds an init container's spec too (upstream's
    /// GetContainerSpec searches init and ephemeral containers); before,
    /// only the regular ones were searched and an init container was
    /// "not found" although it ran.
    #[tokio::test]
    async fn attach_reaches_an_init_container() {
        let (s, rt, _t) = state().await;
        let mut pod = crate::testutil::pod("Always", &["setup"], &["app"]);
        pod.metadata.name = Some("init".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("u9".into());
        let c = pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0].clone();
        let id = run_in(&rt, &pod, &c).await;
        s.pods.upsert(pod);
        rt.clear_calls();
        let (c, b) = call(&s, "GET", "/attach/default/init/setup?output=1", true).await;
        // The fake's streaming URL is a closed port: the runtime was asked.
        assert_eq!(c, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(b.contains("error dialing backend"), "{b}");
        assert!(
            rt.calls().contains(&format!("Attach {id}")),
            "{:?}",
            rt.calls()
        );
    }

    /// Attach as upstream's GetAttach: stderr as asked (a runtime refuses
    /// it beside a TTY, and that refusal is the answer: it was dropped
    /// silently), a path UID that is not the pod's is "pod … not found",
    /// a container the spec lacks "container … not found in pod …".
    #[tokio::test]
    async fn attach_asks_as_upstream() {
        let (s, rt, _t) = state().await;
        call(&s, "GET", "/attach/default/web/app?output=1&error=1", true).await;
        let asked = rt.attach_requests();
        assert!(asked[0].stderr && asked[0].stdout, "{asked:?}");
        // A container running but not in the spec (the spec changed).
        let mut pod = (*s.pods.pods()[0]).clone();
        pod.spec.as_mut().unwrap().containers[0].name = "renamed".into();
        s.pods.upsert(pod.clone());
        let (c, b) = call(&s, "GET", "/attach/default/web/app?output=1", true).await;
        assert_eq!(c, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(b, "container app not found in pod web_default");
        // A UID in the path that is not the pod's, though a container of
        // that UID runs (an older instance).
        let mut old = pod.clone();
        old.metadata.uid = Some("u0".into());
        old.spec.as_mut().unwrap().containers[0].name = "app".into();
        let c0 = old.spec.as_ref().unwrap().containers[0].clone();
        run_in(&rt, &old, &c0).await;
        let (c, b) = call(&s, "GET", "/attach/default/web/u0/app?output=1", true).await;
        assert_eq!(
            (c, b.as_str()),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "pod web_default not found"
            )
        );
        // HEAD is not a streaming request (go-restful's 405).
        let (c, _) = call(&s, "HEAD", "/exec/default/web/app?output=1", true).await;
        assert_eq!(c, StatusCode::METHOD_NOT_ALLOWED);
    }

    /// The runtime's refusals as upstream's streaming.WriteError writes
    /// them: Go's gRPC text, and a 429 with Retry-After; an answer that is
    /// neither an upgrade nor an error is the proxy's 500.
    #[tokio::test]
    async fn runtime_answers_as_upstream() {
        let busy = StreamError::Cri(CriError::Status {
            op: "Exec",
            code: tonic::Code::ResourceExhausted,
            message: "maximum number of in-flight requests exceeded".into(),
        })
        .into_response();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "60");
        let body = axum::body::to_bytes(busy.into_body(), 1 << 10)
            .await
            .unwrap();
        assert_eq!(
            &body[..],
            b"rpc error: code = ResourceExhausted desc = maximum number of in-flight requests exceeded"
        );

        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (s, rt, _t) = state().await;
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        rt.set_stream_base(&format!("http://{}", backend.local_addr().unwrap()));
        tokio::spawn(async move {
            let (mut c, _) = backend.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf).await;
            let _ = c
                .write_all(b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n")
                .await;
        });
        let (c, b) = call(&s, "GET", "/exec/default/web/app?output=1&command=ls", true).await;
        assert_eq!(
            (c, b.as_str()),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "invalid upgrade response: status code 302"
            )
        );
    }

    #[tokio::test]
    async fn routing_and_errors() {
        let (s, rt, _t) = state().await;
        let (c, b) = call(&s, "GET", "/exec/default/nope/app?output=1", true).await;
        assert_eq!(
            (c, b.as_str()),
            (StatusCode::NOT_FOUND, "pod does not exist")
        );
        let (c, _) = call(&s, "GET", "/exec/default/web/app?command=ls", true).await;
        assert_eq!(c, StatusCode::BAD_REQUEST);
        // Upstream answers a missing container with a plain error: 500.
        let (c, b) = call(&s, "GET", "/exec/default/web/other?output=1", true).await;
        assert_eq!(c, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(b.contains("container not found"), "{b}");
        // A UID that is not the running pod's finds no container.
        let (c, _) = call(&s, "GET", "/exec/default/web/u2/app?output=1", true).await;
        assert_eq!(c, StatusCode::INTERNAL_SERVER_ERROR);
        let (c, _) = call(&s, "GET", "/portForward/default/web/u2?port=80", true).await;
        assert_eq!(c, StatusCode::NOT_FOUND);
        // WebSocket port-forward needs ports.
        let (c, _) = call(&s, "GET", "/portForward/default/web", true).await;
        assert_eq!(c, StatusCode::BAD_REQUEST);
        assert!(rt.calls().iter().all(|c| !c.starts_with("Exec")));

        // Resolved: the CRI call is made with the command, then a request
        // that is no upgrade is refused as upstream's proxy does (500).
        let (c, b) = call(
            &s,
            "POST",
            "/exec/default/web/u1/app?output=1&command=echo&command=hi",
            false,
        )
        .await;
        assert_eq!(
            (c, b.as_str()),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Upgrade request required"
            )
        );
        assert!(
            rt.calls()
                .iter()
                .any(|c| c.starts_with("Exec ") && c.ends_with("echo hi")),
            "{:?}",
            rt.calls()
        );
        // An upgrade to the fake's closed port: the dial error, a 500.
        let (c, b) = call(&s, "GET", "/attach/default/web/app?output=1", true).await;
        assert_eq!(c, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(b.contains("error dialing backend"), "{b}");
        let (c, _) = call(&s, "GET", "/portForward/default/web/u1?port=80", true).await;
        assert_eq!(c, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(rt
            .calls()
            .iter()
            .any(|c| c.starts_with("PortForward ") && c.ends_with("[80]")));

        // /run is POST only and answers the command's output.
        let (c, _) = call(&s, "GET", "/run/default/web/app?cmd=ls", false).await;
        assert_eq!(c, StatusCode::METHOD_NOT_ALLOWED);
        let (c, _) = call(&s, "POST", "/run/default/web/app?cmd=ls%20-l", false).await;
        assert_eq!(c, StatusCode::OK);
        assert!(
            rt.calls()
                .iter()
                .any(|c| c.starts_with("ExecSync ") && c.ends_with("ls -l")),
            "{:?}",
            rt.calls()
        );
        let (c, _) = call(&s, "POST", "/run/default/nope/app?cmd=ls", false).await;
        assert_eq!(c, StatusCode::NOT_FOUND);
        let (c, _) = call(&s, "GET", "/exec/default/web", true).await;
        assert_eq!(c, StatusCode::NOT_FOUND);

        // A form body's cmd, as Go's FormValue reads it (before the
        // query's): `curl -d cmd=... .../run/...`. Old code: the query only.
        let form = |body: String| {
            axum::http::Request::builder()
                .method("POST")
                .uri("/run/default/web/app?cmd=from-query")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap()
        };
        let resp = routes()
            .with_state(s.clone())
            .oneshot(form("cmd=uname%20-a&other=1".into()))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let calls = rt.calls();
        assert!(
            calls
                .iter()
                .any(|c| c.starts_with("ExecSync ") && c.ends_with("uname -a")),
            "{calls:?}"
        );
        assert!(
            !calls.iter().any(|c| c.ends_with("from-query")),
            "{calls:?}"
        );
        // A body past the limit is refused before any command runs.
        let resp = routes()
            .with_state(s.clone())
            .oneshot(form(format!("cmd={}", "a".repeat(MAX_FORM_BODY))))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(rt.calls().len(), calls.len());
    }

    #[tokio::test]
    async fn splice_copies_both_ways_and_times_out_when_idle() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let task = tokio::spawn(splice(a, b, Duration::from_secs(3600)));
        a_peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        b_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        b_peer.write_all(b"pong").await.unwrap();
        a_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // One side ends: both are closed, as upstream's tryUpgrade. Old
        // code half-closed and waited for the other side, which a client
        // that never closes held open until the idle timeout.
        b_peer.write_all(b"!").await.unwrap();
        drop(b_peer);
        let mut rest = Vec::new();
        a_peer.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"!", "what the runtime wrote first is delivered");
        let ended = |t| tokio::time::timeout(Duration::from_secs(10), t);
        let done = ended(task).await.expect("the splice ended with one side");
        assert_eq!(done.unwrap().unwrap(), (4, 5));
        // The client ends first: the runtime's side is closed too.
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let task = tokio::spawn(splice(a, b, Duration::from_secs(3600)));
        a_peer.shutdown().await.unwrap();
        let mut rest = Vec::new();
        b_peer.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        let done = ended(task).await.expect("the splice ended with the client");
        assert_eq!(done.unwrap().unwrap(), (0, 0));
        assert!(
            b_peer.write_all(b"late").await.is_err(),
            "the runtime's side is closed, not half-open"
        );

        tokio::time::pause();
        let (a, _a_peer) = tokio::io::duplex(64);
        let (b, _b_peer) = tokio::io::duplex(64);
        let e = splice(a, b, Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }
}
