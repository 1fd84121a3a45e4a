//! The HTTP pod source (`staticPodURL` / `--manifest-url`), as upstream's
//! `pkg/kubelet/config/http.go`: every `httpCheckFrequency` the URL is
//! fetched (with `staticPodURLHeader`), and one Pod or a PodList becomes
//! the source's pods, defaulted like manifest files. A failed fetch keeps
//! the pods it served running; an empty body sets no pods; a body that did
//! not change is not decoded again. The request is made as Go's client
//! makes it (redirects followed, credentials in the URL sent as basic
//! auth, the host as written, through the proxy the environment names).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, HOST, LOCATION, USER_AGENT};
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::static_pod::{http_static_pod, parse_pods, MAX_MANIFEST_BYTES};
use super::{PodOperation, PodUpdate, HTTP_SOURCE};

/// Upstream's client: `http.Client{Timeout: 10 * time.Second}`, which
/// covers the redirects too.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Go's client stops after ten redirects.
const MAX_REDIRECTS: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum HttpSourceError {
    #[error("invalid staticPodURL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("{url}: {code}: {body}")]
    Status {
        url: String,
        code: u16,
        body: String,
    },
    #[error("{url}: the body is larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("zero-length data received from {0}")]
    Empty(String),
}

/// A checked URL: scheme, host, port, request path.
#[derive(Debug, Clone)]
struct Target {
    raw: String,
    url: url::Url,
    https: bool,
    host: String,
    port: u16,
    path: String,
    /// What Go sends as Host: the URL's host, with its port if written.
    host_header: String,
    /// `Basic …` from the URL's user and password, if it has them.
    basic_auth: Option<String>,
}

fn parse(url: &str) -> Result<Target, HttpSourceError> {
    let u = url::Url::parse(url).map_err(|e| HttpSourceError::Url {
        url: url.into(),
        reason: e.to_string(),
    })?;
    target(url, u)
}

fn target(raw: &str, u: url::Url) -> Result<Target, HttpSourceError> {
    let bad = |reason: String| HttpSourceError::Url {
        url: raw.into(),
        reason,
    };
    let https = match u.scheme() {
        "http" => false,
        "https" => true,
        s => return Err(bad(format!("unsupported protocol scheme {s:?}"))),
    };
    let host_str = u
        .host_str()
        .ok_or_else(|| bad("no Host in request URL".into()))?;
    let host = host_str
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = u.port_or_known_default().unwrap_or(80);
    let host_header = match u.port() {
        Some(p) => format!("{host_str}:{p}"),
        None => host_str.to_string(),
    };
    let mut path = u.path().to_string();
    if let Some(q) = u.query() {
        path.push('?');
        path.push_str(q);
    }
    let basic_auth = (!u.username().is_empty() || u.password().is_some()).then(|| {
        use base64::Engine;
        let dec = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let pair = format!("{}:{}", dec(u.username()), dec(u.password().unwrap_or("")));
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    });
    Ok(Target {
        raw: raw.into(),
        url: u,
        https,
        host,
        port,
        path,
        host_header,
        basic_auth,
    })
}

/// Starts polling `url` until `token` is cancelled. The first poll is
/// immediate. A URL that does not parse is an error at each poll, as
/// upstream's (which does not check it up front, and keeps running).
pub fn spawn_http_source(
    url: String,
    headers: BTreeMap<String, Vec<String>>,
    node_name: String,
    period: Duration,
    out: mpsc::Sender<PodUpdate>,
    token: CancellationToken,
) -> JoinHandle<()> {
    let target = parse(&url);
    let headers = Arc::new(headers);
    let span = tracing::info_span!("http-source", url = %url);
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let mut tick = tokio::time::interval(period.max(Duration::from_secs(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failures = 0u32;
            // The last body decoded (upstream's s.data).
            let mut last: Option<Vec<u8>> = None;
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let r = match &target {
                    Ok(t) => tokio::select! {
                        _ = token.cancelled() => return,
                        r = poll(t, &headers, &node_name, &mut last) => r,
                    },
                    Err(HttpSourceError::Url { url, reason }) => Err(HttpSourceError::Url {
                        url: url.clone(),
                        reason: reason.clone(),
                    }),
                    Err(e) => Err(HttpSourceError::Fetch {
                        url: url.clone(),
                        reason: e.to_string(),
                    }),
                };
                let update = match r {
                    Ok(Some(pods)) => pods,
                    // The same body as last time: nothing to tell.
                    Ok(None) => continue,
                    Err(HttpSourceError::Empty(u)) => {
                        // As upstream: an empty set, so the source counts
                        // as seen, and the error logged. The body is
                        // forgotten, so the old one coming back restores
                        // its pods (upstream keeps it and would not).
                        debug!(url = %u, "zero-length data received");
                        last = None;
                        Vec::new()
                    }
                    Err(e) => {
                        // A broken URL keeps the pods it served; the error
                        // is logged at warning once, then quietly.
                        failures += 1;
                        if failures == 1 {
                            warn!(error = %e, "Failed to read pods from URL; keeping its pods");
                        } else {
                            debug!(error = %e, failures, "Failed to read pods from URL");
                        }
                        continue;
                    }
                };
                if failures > 0 {
                    info!(url = %url, "manifest URL answers again");
                }
                failures = 0;
                let update = PodUpdate {
                    pods: update,
                    op: PodOperation::Set,
                    source: HTTP_SOURCE.into(),
                };
                if out.send(update).await.is_err() {
                    return;
                }
            }
        },
        span,
    ))
}

/// One fetch and decode: the pods, `None` when the body is the one last
/// decoded (`last`, updated here), or why not. A pod that fails to decode
/// or validate fails the whole body, as upstream.
async fn poll(
    target: &Target,
    headers: &BTreeMap<String, Vec<String>>,
    node_name: &str,
    last: &mut Option<Vec<u8>>,
) -> Result<Option<Vec<super::Pod>>, HttpSourceError> {
    let env = |k: &str| std::env::var(k).ok();
    let body = tokio::time::timeout(FETCH_TIMEOUT, fetch(target, headers, &env))
        .await
        .map_err(|_| HttpSourceError::Fetch {
            url: target.raw.clone(),
            reason: "Client.Timeout exceeded while awaiting headers".into(),
        })??;
    if body.is_empty() {
        return Err(HttpSourceError::Empty(target.raw.clone()));
    }
    if last.as_deref() == Some(body.as_slice()) {
        return Ok(None);
    }
    *last = Some(body.clone());
    let url = target.raw.clone();
    let node = node_name.to_string();
    // Decoding a body of up to 10 MiB is CPU work: off the async threads.
    let decoded = tokio::task::spawn_blocking(move || {
        let now = SystemTime::now();
        parse_pods(&body, &url)?
            .into_iter()
            .map(|p| http_static_pod(p, &url, &node, now))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| HttpSourceError::Fetch {
        url: target.raw.clone(),
        reason: e.to_string(),
    })?;
    decoded.map(Some).map_err(|e| HttpSourceError::Fetch {
        url: target.raw.clone(),
        reason: e.to_string(),
    })
}

/// Go's shouldCopyHeaderOnRedirect: credentials and cookies follow a
/// redirect only to the same host or one of its subdomains.
fn keeps_credentials(from: &Target, to: &Target) -> bool {
    to.host == from.host || to.host.ends_with(&format!(".{}", from.host))
}

/// GETs the target, following redirects as Go's client does; the body of
/// the final 200.
async fn fetch(
    first: &Target,
    headers: &BTreeMap<String, Vec<String>>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Vec<u8>, HttpSourceError> {
    let mut target = first.clone();
    let mut credentials = true;
    for _ in 0..=MAX_REDIRECTS {
        let (code, location, body) = get_once(&target, headers, credentials, env).await?;
        let redirect = matches!(code, 301 | 302 | 303 | 307 | 308);
        let Some(location) = location.filter(|_| redirect) else {
            if code != 200 {
                let mut text = String::from_utf8_lossy(&body).into_owned();
                text.truncate(512);
                return Err(HttpSourceError::Status {
                    url: first.raw.clone(),
                    code,
                    body: text,
                });
            }
            return Ok(body);
        };
        let next = target
            .url
            .join(&location)
            .map_err(|e| HttpSourceError::Fetch {
                url: first.raw.clone(),
                reason: format!("failed to parse Location header {location:?}: {e}"),
            })?;
        let next = self::target(next.as_str(), next.clone())?;
        credentials = credentials && keeps_credentials(&target, &next);
        target = next;
    }
    Err(HttpSourceError::Fetch {
        url: first.raw.clone(),
        reason: format!("stopped after {MAX_REDIRECTS} redirects"),
    })
}

/// One request: the status, a Location header, and the body.
async fn get_once(
    target: &Target,
    headers: &BTreeMap<String, Vec<String>>,
    credentials: bool,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<(u16, Option<String>, Vec<u8>), HttpSourceError> {
    let fail = |reason: String| HttpSourceError::Fetch {
        url: target.raw.clone(),
        reason,
    };
    let mut req = hyper::Request::get(target.path.as_str())
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .map_err(|e| fail(e.to_string()))?;
    let h = req.headers_mut();
    h.insert(
        HOST,
        HeaderValue::from_str(&target.host_header).map_err(|e| fail(e.to_string()))?,
    );
    for (k, vs) in headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| fail(e.to_string()))?;
        // Go takes the Host from the URL, never from the headers.
        if name == HOST {
            continue;
        }
        let sensitive = name == AUTHORIZATION
            || name.as_str() == "cookie"
            || name.as_str() == "www-authenticate";
        if sensitive && !credentials {
            continue;
        }
        for v in vs {
            h.append(
                name.clone(),
                HeaderValue::from_str(v).map_err(|e| fail(e.to_string()))?,
            );
        }
    }
    if !h.contains_key(USER_AGENT) {
        h.insert(USER_AGENT, HeaderValue::from_static("Go-http-client/1.1"));
    }
    if let Some(auth) = &target.basic_auth {
        if !h.contains_key(AUTHORIZATION) {
            h.insert(
                AUTHORIZATION,
                HeaderValue::from_str(auth).map_err(|e| fail(e.to_string()))?,
            );
        }
    }
    let addr = join_host_port(&target.host, target.port);
    let proxy = proxy_for(target, env).map_err(fail)?;
    let stream = match &proxy {
        None => tokio::net::TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| fail(format!("dial tcp {addr}: {e}")))?,
        Some(p) => {
            let mut conn = tokio::net::TcpStream::connect((p.host.as_str(), p.port))
                .await
                .map_err(|e| {
                    let at = join_host_port(&p.host, p.port);
                    fail(format!("proxyconnect tcp: dial tcp {at}: {e}"))
                })?;
            if target.https {
                connect_tunnel(&mut conn, &addr, p.auth.as_deref())
                    .await
                    .map_err(fail)?;
            } else {
                // A plain request goes to the proxy whole: the absolute URL
                // as its target, as Go's transport sends it.
                *req.uri_mut() = target
                    .url
                    .as_str()
                    .parse()
                    .map_err(|e: hyper::http::uri::InvalidUri| fail(e.to_string()))?;
                if let Some(a) = &p.auth {
                    req.headers_mut().insert(
                        "proxy-authorization",
                        HeaderValue::from_str(a).map_err(|e| fail(e.to_string()))?,
                    );
                }
            }
            conn
        }
    };
    let resp = if target.https {
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| fail(e.to_string()))?;
        let tls = tls_connector()
            .map_err(fail)?
            .connect(name, stream)
            .await
            .map_err(|e| fail(format!("tls: {e}")))?;
        exchange(TokioIo::new(tls), req).await
    } else {
        exchange(TokioIo::new(stream), req).await
    }
    .map_err(fail)?;
    let code = resp.status().as_u16();
    let location = resp
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > MAX_MANIFEST_BYTES {
                return Err(HttpSourceError::TooLarge {
                    url: target.raw.clone(),
                    limit: MAX_MANIFEST_BYTES,
                });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok((code, location, buf))
}

/// An HTTP proxy to go through.
#[derive(Debug, PartialEq)]
struct Proxy {
    host: String,
    port: u16,
    /// `Basic …` from the proxy URL's user and password.
    auth: Option<String>,
}

/// `host:port`, an IPv6 host in brackets (Go's net.JoinHostPort).
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's ProxyFromEnvironment (`golang.org/x/net/http/httpproxy`):
/// `HTTPS_PROXY` for https URLs, `HTTP_PROXY` for http ones (upper case
/// first), none for localhost and loopback addresses or a host `NO_PROXY`
/// names. Only `http://` proxies are supported here: another scheme is an
/// error, not a silent direct connection.
fn proxy_for(
    target: &Target,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Option<Proxy>, String> {
    let var = |upper: &str| {
        env(upper)
            .or_else(|| env(&upper.to_ascii_lowercase()))
            .filter(|v| !v.is_empty())
    };
    let Some(raw) = var(if target.https {
        "HTTPS_PROXY"
    } else {
        "HTTP_PROXY"
    }) else {
        return Ok(None);
    };
    let host = target.host.to_ascii_lowercase();
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback || no_proxy(&var("NO_PROXY").unwrap_or_default(), &host, target.port) {
        return Ok(None);
    }
    // Go reads a proxy without a scheme as http://.
    let with_scheme = if raw.contains("://") {
        raw.clone()
    } else {
        format!("http://{raw}")
    };
    let u =
        url::Url::parse(&with_scheme).map_err(|e| format!("invalid proxy address {raw:?}: {e}"))?;
    if u.scheme() != "http" {
        return Err(format!("proxy scheme {:?} is not supported", u.scheme()));
    }
    let t = self::target(&with_scheme, u).map_err(|e| e.to_string())?;
    Ok(Some(Proxy {
        host: t.host,
        port: t.port,
        auth: t.basic_auth,
    }))
}

/// Whether `NO_PROXY` names `host` (lower case): `*`; an IP or a CIDR
/// holding it; a domain, itself or a subdomain (a leading dot or not);
/// each optionally with a port that must match.
fn no_proxy(list: &str, host: &str, port: u16) -> bool {
    let ip = host.parse::<std::net::IpAddr>().ok();
    list.split(',')
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            if let Some((net, bits)) = entry.split_once('/') {
                return match (net.parse::<std::net::IpAddr>(), bits.parse::<u32>(), ip) {
                    (Ok(net), Ok(bits), Some(ip)) => in_cidr(ip, net, bits),
                    _ => false,
                };
            }
            if let Ok(e) = entry
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<std::net::IpAddr>()
            {
                return Some(e) == ip;
            }
            // A port, if given, must match.
            let (name, want_port) = match entry
                .rsplit_once(':')
                .and_then(|(n, p)| Some((n, p.parse::<u16>().ok()?)))
            {
                Some((n, p)) => (n, Some(p)),
                None => (entry.as_str(), None),
            };
            if want_port.is_some_and(|p| p != port) {
                return false;
            }
            let name = name.trim_start_matches('*').trim_start_matches('.');
            host == name || host.ends_with(&format!(".{name}"))
        })
}

fn in_cidr(ip: std::net::IpAddr, net: std::net::IpAddr, bits: u32) -> bool {
    match (ip, net) {
        (std::net::IpAddr::V4(a), std::net::IpAddr::V4(n)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (std::net::IpAddr::V6(a), std::net::IpAddr::V6(n)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Asks the proxy on `conn` for a tunnel to `addr` (CONNECT), as Go's
/// transport does for an https URL; the answer's head is read byte by
/// byte, so nothing of the tunnel is consumed.
async fn connect_tunnel(
    conn: &mut tokio::net::TcpStream,
    addr: &str,
    auth: Option<&str>,
) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n");
    if let Some(a) = auth {
        head.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("proxyconnect: {e}"))?;
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() > 16 * 1024 {
            return Err("proxyconnect: the proxy's answer is too long".into());
        }
        let n = conn
            .read(&mut byte)
            .await
            .map_err(|e| format!("proxyconnect: {e}"))?;
        if n == 0 {
            return Err("proxyconnect: the proxy closed the connection".into());
        }
        answer.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&answer);
    let line = status.lines().next().unwrap_or_default();
    let ok = line
        .split_whitespace()
        .nth(1)
        .is_some_and(|c| c.starts_with('2'));
    if ok {
        Ok(())
    } else {
        Err(format!("proxyconnect: {line}"))
    }
}

async fn exchange<IO>(
    io: IO,
    req: hyper::Request<http_body_util::Empty<hyper::body::Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    // The connection task ends with the exchange (the sender is dropped).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// TLS with the system's roots, as Go's default client verifies.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, String> {
    static CONNECTOR: std::sync::OnceLock<Result<tokio_rustls::TlsConnector, String>> =
        std::sync::OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
            let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
            Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves `bodies` in turn (status, body) on a loopback port; records
    /// each request's head.
    async fn server(bodies: Vec<(u16, String)>) -> (String, mpsc::UnboundedReceiver<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut bodies = bodies.into_iter().cycle();
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let (code, body) = bodies.next().unwrap();
                let resp = format!(
                    "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        (format!("http://{addr}/manifests?x=1"), rx)
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";

    #[tokio::test]
    async fn a_single_pod_or_a_pod_list_becomes_the_sources_set() {
        let list = r#"{"kind":"PodList","apiVersion":"v1","items":[
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}},
            {"metadata":{"name":"b","namespace":"kube-system"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}]}"#;
        let (url, mut reqs) = server(vec![(200, POD.into()), (200, list.into())]).await;
        let mut headers = BTreeMap::new();
        headers.insert("X-Token".to_string(), vec!["secret".to_string()]);
        // A Host among the headers is not sent (Go takes it from the URL).
        headers.insert("Host".to_string(), vec!["elsewhere".to_string()]);
        let t = parse(&url).unwrap();
        let mut last = None;
        let pods = poll(&t, &headers, "n1", &mut last).await.unwrap().unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].metadata.name.as_deref(), Some("web-n1"));
        // Upstream adds the NoExecute toleration to file pods only.
        assert!(pods[0].spec.as_ref().unwrap().tolerations.is_none());
        let head = reqs.recv().await.unwrap().to_lowercase();
        assert!(head.starts_with("get /manifests?x=1 http/1.1"), "{head}");
        assert!(head.contains("x-token: secret"), "{head}");
        assert!(head.contains("user-agent: go-http-client/1.1"), "{head}");
        assert_eq!(head.matches("host:").count(), 1, "{head}");
        assert!(!head.contains("elsewhere"), "{head}");
        let pods = poll(&t, &headers, "n1", &mut last).await.unwrap().unwrap();
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a-n1", "b-n1"]);
        assert_eq!(pods[1].metadata.namespace.as_deref(), Some("kube-system"));
        // The UID is the URL's, not a file's: the same pod from a file
        // path equal to the URL text would get another one.
        let from_file = super::super::static_pod::decode_static_pod(
            POD.as_bytes(),
            std::path::Path::new(&url),
            "n1",
        )
        .unwrap();
        let again = parse_pods(POD.as_bytes(), &url).unwrap().remove(0);
        let http = http_static_pod(again, &url, "n1", SystemTime::now()).unwrap();
        assert_ne!(from_file.metadata.uid, http.metadata.uid);
    }

    #[tokio::test]
    async fn errors_keep_the_pods_and_an_empty_body_sets_none() {
        let (url, _reqs) = server(vec![
            (200, POD.into()),
            (500, "boom".into()),
            (200, "not a pod".into()),
            (200, String::new()),
        ])
        .await;
        let (tx, mut rx) = mpsc::channel(8);
        let token = CancellationToken::new();
        let h = spawn_http_source(
            url,
            BTreeMap::new(),
            "n1".into(),
            Duration::from_millis(1),
            tx,
            token.clone(),
        );
        let first = rx.recv().await.unwrap();
        assert_eq!(first.pods.len(), 1);
        assert_eq!(first.source, HTTP_SOURCE);
        // The 500 and the undecodable body send nothing; the empty body
        // sends an empty set.
        let next = rx.recv().await.unwrap();
        assert!(next.pods.is_empty(), "{:?}", next.pods);
        token.cancel();
        h.await.unwrap();
    }

    #[test]
    fn urls_are_read_as_go_reads_them() {
        assert!(parse("ftp://x/y").is_err());
        assert!(parse("not a url").is_err());
        let t = parse("https://[::1]/p").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.https), ("::1", 443, true));
        // The Host header as written: no default port added.
        assert_eq!(t.host_header, "[::1]");
        assert_eq!(parse("http://a:8080/").unwrap().host_header, "a:8080");
        // Credentials in the URL: basic auth (percent-decoded).
        let t = parse("http://us%40er:p%3Ass@a/").unwrap();
        assert_eq!(
            t.basic_auth.as_deref(),
            Some("Basic dXNAZXI6cDpzcw==") // "us@er:p:ss"
        );
        assert!(parse("http://a/").unwrap().basic_auth.is_none());
    }

    /// A URL that does not parse is not a startup error (upstream does not
    /// check it): each poll fails and the kubelet runs on.
    #[tokio::test]
    async fn a_bad_url_fails_each_poll_not_the_start() {
        let (tx, mut rx) = mpsc::channel(8);
        let token = CancellationToken::new();
        let h = spawn_http_source(
            "not a url".into(),
            BTreeMap::new(),
            "n1".into(),
            Duration::from_millis(1),
            tx,
            token.clone(),
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.recv())
                .await
                .is_err(),
            "no update from a bad URL"
        );
        token.cancel();
        h.await.unwrap();
    }

    /// Redirects are followed as Go's client follows them: the headers go
    /// along, credentials only to the same host; an unchanged body is not
    /// decoded again.
    #[tokio::test]
    async fn redirects_are_followed_and_unchanged_bodies_skipped() {
        let (target, mut reqs) = server(vec![(200, POD.into())]).await;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = format!("http://user:pw@{}/old", l.local_addr().unwrap());
        // "localhost" is another host than 127.0.0.1: no credentials.
        let to = target.replace("127.0.0.1", "localhost");
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        let mut headers = BTreeMap::new();
        headers.insert("X-Token".to_string(), vec!["secret".to_string()]);
        headers.insert("Authorization".to_string(), vec!["Bearer t".to_string()]);
        let t = parse(&front).unwrap();
        let mut last = None;
        let pods = poll(&t, &headers, "n1", &mut last).await.unwrap().unwrap();
        assert_eq!(pods.len(), 1);
        let head = reqs.recv().await.unwrap().to_lowercase();
        assert!(head.contains("x-token: secret"), "{head}");
        assert!(!head.contains("authorization"), "{head}");
        assert!(poll(&t, &headers, "n1", &mut last).await.unwrap().is_none());
    }

    /// Go's ProxyFromEnvironment: the scheme's variable (upper case
    /// first), never for loopback, NO_PROXY's domains, IPs, CIDRs and
    /// ports; a proxy without a scheme is http://.
    #[test]
    fn proxies_are_chosen_as_go_chooses_them() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let t = parse("https://manifests.example.com/p").unwrap();
        let vars = env(&[
            ("HTTPS_PROXY", "proxy.corp:3128"),
            ("https_proxy", "ignored:1"),
            ("http_proxy", "http://u:p@plain:8080"),
        ]);
        assert_eq!(
            proxy_for(&t, &vars).unwrap(),
            Some(Proxy {
                host: "proxy.corp".into(),
                port: 3128,
                auth: None
            })
        );
        let p = proxy_for(&parse("http://a.example.com/").unwrap(), &vars)
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.host.as_str(), p.auth.as_deref()),
            ("plain", Some("Basic dTpw"))
        );
        assert_eq!(
            proxy_for(&parse("https://127.0.0.1/").unwrap(), &vars),
            Ok(None)
        );
        assert_eq!(
            proxy_for(&parse("https://localhost/").unwrap(), &vars),
            Ok(None)
        );
        assert_eq!(proxy_for(&t, &env(&[])), Ok(None));
        assert!(proxy_for(&t, &env(&[("HTTPS_PROXY", "socks5://s:1")])).is_err());
        for (list, excluded) in [
            ("example.com", true),
            (".example.com", true),
            ("*.example.com", true),
            ("other.com, manifests.example.com", true),
            ("example.com:443", true),
            ("example.com:8443", false),
            ("ample.com", false),
            ("*", true),
        ] {
            assert_eq!(
                no_proxy(list, "manifests.example.com", 443),
                excluded,
                "{list}"
            );
        }
        assert!(no_proxy("10.0.0.0/8", "10.1.2.3", 80));
        assert!(!no_proxy("10.0.0.0/8", "11.1.2.3", 80));
        assert!(no_proxy("10.1.2.3", "10.1.2.3", 80));
        assert!(no_proxy("[::2]", "::2", 80));
    }

    /// An http URL through a proxy: the request goes to the proxy with
    /// the absolute URL as its target.
    #[tokio::test]
    async fn an_http_url_goes_through_the_proxy() {
        let (proxy, mut reqs) = server(vec![(200, POD.into())]).await;
        let proxy_addr = proxy.trim_end_matches("/manifests?x=1").to_string();
        let env = move |k: &str| (k == "HTTP_PROXY").then(|| proxy_addr.clone());
        let t = parse("http://manifests.example.com/pod.yaml").unwrap();
        let body = fetch(&t, &BTreeMap::new(), &env).await.unwrap();
        assert_eq!(body, POD.as_bytes());
        let head = reqs.recv().await.unwrap();
        assert!(
            head.starts_with("GET http://manifests.example.com/pod.yaml HTTP/1.1\r\n"),
            "{head}"
        );
    }

    /// An https URL through a proxy: a CONNECT tunnel, then the request
    /// inside it (here the tunnel is refused, which is the proxy's answer).
    #[tokio::test]
    async fn an_https_url_asks_the_proxy_for_a_tunnel() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let asked = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let e = connect_tunnel(&mut conn, "manifests.example.com:443", Some("Basic dTpw"))
            .await
            .unwrap_err();
        assert_eq!(e, "proxyconnect: HTTP/1.1 403 Forbidden");
        let head = asked.await.unwrap();
        assert!(
            head.starts_with("CONNECT manifests.example.com:443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Proxy-Authorization: Basic dTpw\r\n"),
            "{head}"
        );
    }

    /// A PodList needs its apiVersion, as upstream's decoder.
    #[test]
    fn a_pod_list_without_api_version_is_refused() {
        let list = r#"{"kind":"PodList","items":[]}"#;
        assert!(parse_pods(list.as_bytes(), "http://a/").is_err());
        let list = r#"{"kind":"PodList","apiVersion":"v1","items":[]}"#;
        assert!(parse_pods(list.as_bytes(), "http://a/").unwrap().is_empty());
    }
}
