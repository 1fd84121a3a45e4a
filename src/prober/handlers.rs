//! The probe handlers: exec through the CRI, HTTP GET, TCP connect and the
//! gRPC health check (upstream `prober.go` and `pkg/probe/{exec,http,tcp,
//! grpc}`).

use std::pin::Pin;
use std::time::Duration;

use hyper::body::Body as _;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST, LOCATION};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, EnvVar, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::cri::{CriError, RuntimeService};

use super::health;

/// Upstream's `kube-probe/<major>.<minor>` for the Kubernetes version
/// rkubelet follows.
pub(crate) const USER_AGENT_VALUE: &str = "kube-probe/1.34";
/// Upstream reads at most 10 KiB of an HTTP body or exec output.
pub(crate) const MAX_OUTPUT: usize = 10 * 1024;
/// Upstream's `maxProbeRetries`: attempts for a probe that errors.
const MAX_RETRIES: usize = 3;
/// Same-host redirects followed before giving up (Go's client default).
const MAX_REDIRECTS: usize = 10;

/// A probe's verdict with its output (upstream `probe.Result`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success(String),
    /// A success worth a warning (an HTTP redirect not followed).
    Warning(String),
    Failure(String),
}

/// `Err` is a prober error (bad port name, runtime error): upstream retries
/// it and then discards the result.
pub(crate) type ProbeResult = Result<Outcome, String>;

pub(crate) async fn run_probe(
    runtime: &dyn RuntimeService,
    spec: &Probe,
    container: &Container,
    container_id: &str,
    pod_ip: &str,
    timeout: Duration,
) -> ProbeResult {
    let mut result = Err(String::new());
    for _ in 0..MAX_RETRIES {
        result = run_once(runtime, spec, container, container_id, pod_ip, timeout).await;
        if result.is_ok() {
            break;
        }
    }
    result
}

async fn run_once(
    runtime: &dyn RuntimeService,
    spec: &Probe,
    container: &Container,
    container_id: &str,
    pod_ip: &str,
    timeout: Duration,
) -> ProbeResult {
    if let Some(exec) = &spec.exec {
        let cmd = expand_static(
            exec.command.as_deref().unwrap_or_default(),
            container.env.as_deref().unwrap_or_default(),
        );
        exec_probe(runtime, container_id, cmd, timeout).await
    } else if let Some(action) = &spec.http_get {
        let target = HttpTarget::from_action(action, container, pod_ip)?;
        http_probe(&target, timeout).await
    } else if let Some(tcp) = &spec.tcp_socket {
        let port = resolve_port(&tcp.port, container)?;
        let host = tcp
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(pod_ip);
        if host.is_empty() {
            return Err("no host and no pod IP to probe".into());
        }
        Ok(tcp_probe(host, port, timeout).await)
    } else if let Some(grpc) = &spec.grpc {
        if pod_ip.is_empty() {
            return Err("no pod IP to probe".into());
        }
        let port = u16::try_from(grpc.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port number: {}", grpc.port))?;
        let service = grpc.service.clone().unwrap_or_default();
        Ok(grpc_probe(pod_ip, port, &service, timeout).await)
    } else {
        Err(format!(
            "missing probe handler for container {}",
            container.name
        ))
    }
}

/// Upstream `ResolveContainerPort`: a number, or the `containerPort` of the
/// container's port with that name.
pub(crate) fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| format!("port {name:?} not found"))?,
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

/// Expands `$(VAR)` with the container's literal env values (upstream
/// `ExpandContainerCommandOnlyStatic`): `$$` escapes a `$`, unknown
/// references stay as written.
pub(crate) fn expand_static(cmd: &[String], env: &[EnvVar]) -> Vec<String> {
    // Only literal values are known here; the last definition of a name wins.
    let vars: std::collections::HashMap<String, String> = env
        .iter()
        .filter(|e| e.value_from.is_none())
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    cmd.iter()
        .map(|arg| crate::kuberuntime::container::expand(arg, &vars))
        .collect()
}

fn lossy_limited(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT)]).into_owned()
}

/// ExecSync with the probe's timeout: exit 0 succeeds, any other exit code
/// fails, and a timeout fails too (upstream since 1.20, ExecProbeTimeout).
pub(crate) async fn exec_probe(
    runtime: &dyn RuntimeService,
    container_id: &str,
    cmd: Vec<String>,
    timeout: Duration,
) -> ProbeResult {
    let line = cmd.join(" ");
    match runtime
        .exec_sync(container_id, cmd, timeout.as_secs() as i64)
        .await
    {
        Ok(resp) => {
            let mut output = resp.stdout;
            output.extend_from_slice(&resp.stderr);
            let output = lossy_limited(&output);
            Ok(if resp.exit_code == 0 {
                Outcome::Success(output)
            } else {
                Outcome::Failure(output)
            })
        }
        Err(CriError::DeadlineExceeded { .. }) => {
            Ok(Outcome::Failure(format!("command {line:?} timed out")))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// `host:port`, with brackets around an IPv6 host.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

pub(crate) async fn tcp_probe(host: &str, port: u16, limit: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    match timeout(limit, TcpStream::connect((host, port))).await {
        Ok(Ok(_conn)) => Outcome::Success(String::new()),
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: connect: {e}")),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// Health/Check over plaintext HTTP/2; only SERVING succeeds. Every
/// problem is a failure, like the `grpc_health_probe` tool.
pub(crate) async fn grpc_probe(host: &str, port: u16, service: &str, limit: Duration) -> Outcome {
    use health::health_check_response::ServingStatus;
    use health::health_client::HealthClient;

    let addr = join_host_port(host, port);
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(USER_AGENT_VALUE))
    {
        Ok(e) => e.connect_timeout(limit),
        Err(e) => {
            return Outcome::Failure(format!("error: failed to connect service at {addr:?}: {e}"))
        }
    };
    let start = tokio::time::Instant::now();
    let channel = match timeout(limit, endpoint.connect()).await {
        Ok(Ok(ch)) => ch,
        Ok(Err(e)) => {
            return Outcome::Failure(format!(
                "error: failed to connect service at {addr:?}: {}",
                error_chain(&e)
            ))
        }
        Err(_) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {limit:?}"
            ))
        }
    };
    let left = limit.saturating_sub(start.elapsed());
    let mut client = HealthClient::new(channel);
    let req = health::HealthCheckRequest {
        service: service.to_string(),
    };
    match timeout(left, client.check(req)).await {
        Err(_) => Outcome::Failure(format!("timeout: health rpc did not complete within {limit:?}")),
        Ok(Err(status)) => match status.code() {
            tonic::Code::Unimplemented => Outcome::Failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )),
            tonic::Code::DeadlineExceeded => Outcome::Failure(format!(
                "timeout: health rpc did not complete within {limit:?}"
            )),
            _ => Outcome::Failure(format!("error: health rpc probe failed: {status}")),
        },
        Ok(Ok(resp)) => {
            let status = resp.into_inner().status();
            if status == ServingStatus::Serving {
                Outcome::Success("service healthy".into())
            } else {
                Outcome::Failure(format!(
                    "service unhealthy (responded with {:?})",
                    status.as_str_name()
                ))
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// An absolute http(s) URL, reduced to what a probe needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    pub scheme: String,
    /// Without brackets for IPv6.
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`; no fragment.
    pub path: String,
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme,
            join_host_port(&self.host, self.port),
            self.path
        )
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" {
        443
    } else {
        80
    }
}

/// Percent-encodes what may not appear in a request target, so paths with
/// spaces or non-ASCII characters are still sent (Go's url package escapes
/// them the same way).
fn escape_target(path: &str) -> String {
    let mut s = String::with_capacity(path.len());
    for b in path.bytes() {
        let ok = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b);
        if ok {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn normalize_path(path: &str) -> String {
    let path = path.split('#').next().unwrap_or_default();
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    escape_target(&path)
}

impl Url {
    /// Parses `scheme://[userinfo@]host[:port][/path][?query]`.
    fn parse_absolute(s: &str) -> Option<Url> {
        let (scheme, rest) = s.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        {
            return None;
        }
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let port = match port {
            Some("") | None => default_port(&scheme),
            Some(p) => p.parse().ok()?,
        };
        if host.is_empty() {
            return None;
        }
        Some(Url {
            scheme,
            host: host.to_string(),
            port,
            path: normalize_path(path),
        })
    }

    /// Resolves a `Location` against this URL; `None` when unparsable.
    fn join(&self, loc: &str) -> Option<Url> {
        let loc = loc.trim();
        if let Some(rest) = loc.strip_prefix("//") {
            return Url::parse_absolute(&format!("{}://{rest}", self.scheme));
        }
        if loc.contains("://") && !loc.starts_with(['/', '?']) {
            return Url::parse_absolute(loc);
        }
        let path = if loc.starts_with('/') {
            loc.to_string()
        } else if loc.starts_with('?') {
            let base = self.path.split('?').next().unwrap_or("/");
            format!("{base}{loc}")
        } else {
            let base = self.path.split('?').next().unwrap_or("/");
            let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
            format!("{dir}{loc}")
        };
        Some(Url {
            path: normalize_path(&path),
            ..self.clone()
        })
    }
}

/// An HTTP GET probe request, as upstream `NewRequestForHTTPGetAction`
/// builds it.
#[derive(Debug, Clone)]
pub(crate) struct HttpTarget {
    pub url: Url,
    /// Request headers in order, `Host` excluded.
    pub headers: Vec<(String, String)>,
    /// A `Host` header from the spec, sent instead of `host:port`.
    pub host_header: Option<String>,
}

impl HttpTarget {
    pub fn from_action(
        action: &HTTPGetAction,
        container: &Container,
        pod_ip: &str,
    ) -> Result<Self, String> {
        let scheme = action
            .scheme
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or("http")
            .to_ascii_lowercase();
        let host = action
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(pod_ip);
        if host.is_empty() {
            return Err("no host and no pod IP to probe".into());
        }
        let port = resolve_port(&action.port, container)?;
        let mut headers = Vec::new();
        let mut host_header = None;
        for h in action.http_headers.iter().flatten() {
            if h.name.eq_ignore_ascii_case("host") {
                host_header.get_or_insert_with(|| h.value.clone());
            } else {
                headers.push((h.name.clone(), h.value.clone()));
            }
        }
        let has = |name: &str, headers: &[(String, String)]| {
            headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
        };
        if !has("user-agent", &headers) {
            headers.push(("User-Agent".into(), USER_AGENT_VALUE.into()));
        }
        let accept_empty = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("accept"))
            .map(|(_, v)| v.is_empty());
        match accept_empty {
            // Not set: accept everything.
            None => headers.push(("Accept".into(), "*/*".into())),
            // Set to empty: send none.
            Some(true) => headers.retain(|(k, _)| !k.eq_ignore_ascii_case("accept")),
            Some(false) => {}
        }
        Ok(HttpTarget {
            url: Url {
                scheme,
                host: host.to_string(),
                port,
                path: normalize_path(action.path.as_deref().unwrap_or_default()),
            },
            headers,
            host_header,
        })
    }
}

/// GET with the probe timeout over everything (connect, redirects, body).
/// 2xx succeeds; 3xx succeeds with a warning (a redirect to another host is
/// not followed); anything else fails, and so does any transport error.
pub(crate) async fn http_probe(target: &HttpTarget, limit: Duration) -> ProbeResult {
    match timeout(limit, http_follow(target)).await {
        Ok(r) => r,
        Err(_) => Ok(Outcome::Failure(format!(
            "Get \"{}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            target.url
        ))),
    }
}

/// Aborts the connection task when the exchange is over.
struct ConnGuard(tokio::task::JoinHandle<()>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn http_follow(target: &HttpTarget) -> ProbeResult {
    let first_host = target.url.host.clone();
    let mut url = target.url.clone();
    let mut host_header = target.host_header.clone();
    let mut hop = 0;
    loop {
        hop += 1;
        match url.scheme.as_str() {
            "http" | "https" => {}
            other => {
                return Ok(Outcome::Failure(format!(
                    "Get \"{url}\": unsupported protocol scheme {other:?}"
                )))
            }
        }
        let (resp, _conn) = match send(&url, &target.headers, host_header.as_deref()).await {
            Ok(r) => r,
            Err(e) => return Ok(Outcome::Failure(format!("Get \"{url}\": {e}"))),
        };
        let code = resp.status().as_u16();
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        if let (301 | 302 | 303 | 307 | 308, Some(loc)) = (code, location) {
            let Some(next) = url.join(&loc) else {
                return Ok(Outcome::Failure(format!(
                    "Get \"{url}\": failed to parse Location header {loc:?}"
                )));
            };
            // Upstream's redirect checker: another host ends the chain and
            // the redirect response itself is the result.
            if next.host == first_host {
                if hop >= MAX_REDIRECTS {
                    return Ok(Outcome::Failure(format!(
                        "Get \"{next}\": stopped after {MAX_REDIRECTS} redirects"
                    )));
                }
                // Go keeps the request's custom Host header only through
                // relative redirects.
                let absolute = loc.contains("://") || loc.starts_with("//");
                host_header = if absolute {
                    None
                } else {
                    target.host_header.clone()
                };
                url = next;
                continue;
            }
        }
        let body = read_limited(resp.into_body()).await?;
        return Ok(classify(code, &body));
    }
}

fn classify(code: u16, body: &[u8]) -> Outcome {
    let body = String::from_utf8_lossy(body).into_owned();
    match code {
        200..=299 => Outcome::Success(body),
        300..=399 => Outcome::Warning(format!("Probe terminated redirects, Response body: {body}")),
        _ => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
    }
}

async fn send(
    url: &Url,
    headers: &[(String, String)],
    host_header: Option<&str>,
) -> Result<(hyper::Response<hyper::body::Incoming>, ConnGuard), String> {
    let mut req = hyper::Request::get(url.path.as_str())
        .body(String::new())
        .map_err(|e| e.to_string())?;
    let h = req.headers_mut();
    let host = host_header
        .map(str::to_string)
        .unwrap_or_else(|| join_host_port(&url.host, url.port));
    h.insert(
        HOST,
        HeaderValue::from_str(&host).map_err(|_| format!("invalid Host header {host:?}"))?,
    );
    for (k, v) in headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("net/http: invalid header field name {k:?}"))?;
        let value = HeaderValue::from_str(v)
            .map_err(|_| format!("net/http: invalid header field value for {k:?}"))?;
        h.append(name, value);
    }
    // Upstream's transport disables keep-alives.
    h.insert(CONNECTION, HeaderValue::from_static("close"));

    let addr = join_host_port(&url.host, url.port);
    let stream = TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| format!("dial tcp {addr}: connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    if url.scheme == "https" {
        let name = super::tls::server_name(&url.host)?;
        let tls = super::tls::connector()
            .connect(name, stream)
            .await
            .map_err(|e| format!("tls handshake: {e}"))?;
        return exchange(TokioIo::new(tls), req).await;
    }
    exchange(TokioIo::new(stream), req).await
}

/// One request/response over an established connection (plain or TLS).
async fn exchange<IO>(
    io: IO,
    req: hyper::Request<String>,
) -> Result<(hyper::Response<hyper::body::Incoming>, ConnGuard), String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let guard = ConnGuard(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| error_chain(&e))?;
    Ok((resp, guard))
}

/// Reads at most [`MAX_OUTPUT`] bytes of the body; the rest is dropped with
/// the connection. A broken body is a prober error, as upstream.
async fn read_limited(mut body: hyper::body::Incoming) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    while buf.len() < MAX_OUTPUT {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Err(e)) => return Err(format!("reading probe response body: {e}")),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = (MAX_OUTPUT - buf.len()).min(data.len());
                    buf.extend_from_slice(&data[..take]);
                }
            }
        }
    }
    Ok(buf)
}
