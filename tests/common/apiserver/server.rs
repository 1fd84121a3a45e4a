//! The HTTP side of the API server double: connections (TLS or plain),
//! authentication, routing, list/watch, and the write verbs over the store.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::serviceaccount;
use super::store::{self, ApiError, DeleteOpts, Deleted, ResourceInfo, Selector, Store, Sub};
use super::RequestRecord;

/// What a connection's requests are checked against.
pub struct Shared {
    pub store: Mutex<Store>,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub require_user: bool,
    pub bootstrap_tokens: Vec<String>,
    pub bootstrap_csr_only: AtomicBool,
    pub bookmark_interval: Duration,
    pub partition: watch::Sender<bool>,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub port: u16,
    pub reviews: Mutex<Reviews>,
}

/// What the double's TokenReview and SubjectAccessReview answer: the
/// real server asks its authenticators and authorizers; tests set these.
#[derive(Default)]
pub struct Reviews {
    /// Bearer token -> (username, uid, groups).
    pub tokens: std::collections::HashMap<String, (String, String, Vec<String>)>,
    /// (user, verb, resource, subresource) allowed; "*" matches anything.
    pub allow: Vec<[String; 4]>,
}

/// A response body: all at once, or a stream of watch events.
pub enum RespBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }
}

fn json_response(code: u16, v: &Value) -> Response<RespBody> {
    let body = serde_json::to_vec(v).expect("json");
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(RespBody::Full(Some(Bytes::from(body))))
        .expect("response")
}

fn error_response(e: &ApiError) -> Response<RespBody> {
    json_response(e.code, &e.status())
}

/// Accepts connections until `stop`; each is served on `tracker`.
pub async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.cancelled() => return,
        };
        let Ok((tcp, _)) = conn else { continue };
        let shared = shared.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = connection(shared, tcp) => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

async fn connection(shared: Arc<Shared>, tcp: TcpStream) {
    if *shared.partition.borrow() {
        // Partitioned: the connection is accepted but nothing is read or
        // written; when the partition heals it is closed unanswered.
        let _held = tcp;
        healed(&shared).await;
        return;
    }
    let _ = tcp.set_nodelay(true);
    match shared.tls.clone() {
        Some(acceptor) => {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| super::pki::cert_identity(c));
            http(shared, tls, identity).await
        }
        None => http(shared, tcp, None).await,
    }
}

/// Waits until the network partition (if any) is over.
async fn healed(shared: &Shared) {
    let mut p = shared.partition.subscribe();
    let _ = p.wait_for(|on| !*on).await;
}

async fn http<S>(shared: Arc<Shared>, io: S, identity: Option<(String, Vec<String>)>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Cancelled to drop the connection without an answer (partitions).
    let kill = CancellationToken::new();
    let k = kill.clone();
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        let identity = identity.clone();
        let kill = k.clone();
        async move { Ok::<_, Infallible>(handle(shared, identity, kill, req).await) }
    });
    tokio::select! {
        _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc) => {}
        _ = kill.cancelled() => {}
    }
}

async fn read_body(mut b: Incoming) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut b).poll_frame(cx)).await {
        let frame = frame.map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Ok(d) = frame.into_data() {
            out.extend_from_slice(&d);
        }
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Query {
        Query(
            q.unwrap_or("")
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(p), String::new()),
                })
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// Who a request is from: a client certificate, a bootstrap token, or
/// anonymous.
fn authenticate(
    shared: &Shared,
    identity: Option<(String, Vec<String>)>,
    req: &Request<Incoming>,
) -> Result<(String, Vec<String>, bool), ApiError> {
    let unauthorized = || ApiError::new(401, "Unauthorized", "Unauthorized");
    if let Some((user, mut groups)) = identity {
        groups.push("system:authenticated".into());
        return Ok((user, groups, false));
    }
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if let Some(token) = auth.and_then(|a| a.strip_prefix("Bearer ")) {
        let token = token.trim();
        if shared.bootstrap_tokens.iter().any(|t| t == token) {
            let id = token.split('.').next().unwrap_or("");
            return Ok((
                format!("system:bootstrap:{id}"),
                vec!["system:bootstrappers".into(), "system:authenticated".into()],
                true,
            ));
        }
        return Err(unauthorized());
    }
    if shared.require_user {
        return Err(unauthorized());
    }
    Ok((
        "system:anonymous".into(),
        vec!["system:unauthenticated".into()],
        false,
    ))
}

async fn handle(
    shared: Arc<Shared>,
    identity: Option<(String, Vec<String>)>,
    kill: CancellationToken,
    req: Request<Incoming>,
) -> Response<RespBody> {
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let index = {
        let mut r = shared.requests.lock();
        r.push(RequestRecord {
            method: req.method().to_string(),
            path: path_and_query,
            status: 0,
            user: String::new(),
            time: SystemTime::now(),
        });
        r.len() - 1
    };
    if *shared.partition.borrow() {
        // Partitioned: no answer; when it heals the connection is closed.
        healed(&shared).await;
        kill.cancel();
        std::future::pending::<()>().await;
    }
    let auth = authenticate(&shared, identity, &req);
    if let Ok((user, _, _)) = &auth {
        shared.requests.lock()[index].user = user.clone();
    }
    let resp = match auth {
        Ok((user, groups, bootstrap)) => route(&shared, req, &user, &groups, bootstrap, kill).await,
        Err(e) => error_response(&e),
    };
    shared.requests.lock()[index].status = resp.status().as_u16();
    resp
}

/// A request for a resource: which one, in which namespace, which object
/// and subresource.
struct Target {
    res: &'static ResourceInfo,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, more @ ..] if !matches!(*plural, "status" | "finalize") => {
            (Some(ns.to_string()), {
                let mut v = vec![*plural];
                v.extend_from_slice(more);
                v
            })
        }
        other => (None, other.to_vec()),
    };
    let res = store::find(group, version, rest.first()?)?;
    if ns.is_some() && !res.namespaced {
        return None;
    }
    if rest.len() > 3 {
        return None;
    }
    Some(Target {
        res,
        ns,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

async fn route(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    user: &str,
    groups: &[String],
    bootstrap: bool,
    kill: CancellationToken,
) -> Response<RespBody> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if req.method() == hyper::Method::GET {
        if let Some(v) = discovery(shared, &segs) {
            return json_response(200, &v);
        }
    }
    if req.method() == hyper::Method::POST {
        let review = match path.as_str() {
            "/apis/authentication.k8s.io/v1/tokenreviews" => Some(token_review as ReviewFn),
            "/apis/authorization.k8s.io/v1/subjectaccessreviews" => Some(access_review as ReviewFn),
            _ => None,
        };
        if let Some(review) = review {
            let ct = req
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
                .unwrap_or_default();
            let result = match read_body(req.into_body()).await {
                Ok(b) => parse_json(&ct, &b).and_then(|obj| review(shared, obj)),
                Err(e) => Err(e),
            };
            return match result {
                Ok(v) => json_response(201, &v),
                Err(e) => error_response(&e),
            };
        }
    }
    let Some(t) = parse_target(&segs) else {
        return error_response(&not_found_path());
    };
    // RBAC for bootstrap tokens (system:node-bootstrapper): CSRs only.
    if bootstrap
        && shared.bootstrap_csr_only.load(Ordering::Relaxed)
        && t.res.plural != "certificatesigningrequests"
    {
        let e = ApiError::new(
            403,
            "Forbidden",
            format!(
                "{} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\"",
                t.res.plural,
                req.method().as_str().to_lowercase(),
                t.res.plural,
                t.res.group
            ),
        );
        return error_response(&e);
    }
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
        .unwrap_or_default();
    let body = match read_body(req.into_body()).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let result = match (method.as_str(), &t.name) {
        ("GET", None) if query.flag("watch") => return start_watch(shared, &t, &query, kill),
        ("GET", None) => list(shared, &t, &query),
        ("GET", Some(name)) => {
            // The ephemeralcontainers and resize subresources read as the pod.
            let readable = |s: &&str| {
                *s != "status"
                    && (!matches!(*s, "ephemeralcontainers" | "resize") || t.res.plural != "pods")
            };
            if let Some(s) = t.sub.as_deref().filter(readable) {
                Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("subresource {s:?} not found"),
                ))
            } else {
                let st = shared.store.lock();
                st.get(t.res, t.ns.as_deref().unwrap_or(""), name)
                    .map(|o| (200, o))
                    .ok_or_else(|| store::ApiError::not_found(t.res, name))
            }
        }
        ("POST", Some(name))
            if t.res.plural == "serviceaccounts" && t.sub.as_deref() == Some("token") =>
        {
            let Some(ns) = t.ns.clone() else {
                return error_response(&not_found_path());
            };
            let issued = parse_json(&content_type, &body).and_then(|obj| {
                serviceaccount::token_request(&mut shared.store.lock(), &ns, name, obj)
            });
            match issued {
                Ok((v, warning)) => {
                    let mut resp = json_response(201, &v);
                    if let Some(w) = warning {
                        // As warning.AddWarning: a 299 Warning header.
                        let value = format!("299 - {w:?}");
                        if let Ok(h) = hyper::header::HeaderValue::from_str(&value) {
                            resp.headers_mut().insert("warning", h);
                        }
                    }
                    return resp;
                }
                Err(e) => Err(e),
            }
        }
        ("POST", None) => parse_json(&content_type, &body).and_then(|obj| {
            let ns = t.ns.clone().unwrap_or_default();
            if t.res.namespaced && ns.is_empty() {
                return Err(not_found_path());
            }
            if obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|rv| !rv.is_empty())
            {
                return Err(ApiError::bad_request(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            shared
                .store
                .lock()
                .create(t.res, &ns, obj, Some((user, groups)))
                .map(|o| (201, o))
        }),
        ("PUT", Some(name)) => match sub_of(&t) {
            Ok(sub) => parse_json(&content_type, &body).and_then(|obj| {
                shared
                    .store
                    .lock()
                    .update(t.res, t.ns.as_deref().unwrap_or(""), name, obj, sub)
                    .map(|o| (200, o))
            }),
            Err(e) => Err(e),
        },
        ("PATCH", Some(name)) => match sub_of(&t) {
            Ok(sub) => {
                if content_type == "application/apply-patch+yaml" {
                    Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "server-side apply is not implemented by the API server double",
                    ))
                } else {
                    serde_json::from_slice::<Value>(&body)
                        .map_err(|e| ApiError::bad_request(format!("invalid patch body: {e}")))
                        .and_then(|patch| {
                            shared
                                .store
                                .lock()
                                .patch(
                                    t.res,
                                    t.ns.as_deref().unwrap_or(""),
                                    name,
                                    &content_type,
                                    &patch,
                                    sub,
                                )
                                .map(|o| (200, o))
                        })
                }
            }
            Err(e) => Err(e),
        },
        ("DELETE", Some(name)) if t.sub.is_none() => delete(shared, &t, name, &query, &body),
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported here by the API server double"),
        )),
    };
    match result {
        Ok((code, v)) => json_response(code, &v),
        Err(e) => error_response(&e),
    }
}

fn sub_of(t: &Target) -> Result<Sub, ApiError> {
    match t.sub.as_deref() {
        None => Ok(Sub::Main),
        Some("status") if t.res.status => Ok(Sub::Status),
        Some("approval") if t.res.plural == "certificatesigningrequests" => Ok(Sub::Approval),
        Some("ephemeralcontainers") if t.res.plural == "pods" => Ok(Sub::EphemeralContainers),
        Some("resize") if t.res.plural == "pods" => Ok(Sub::Resize),
        Some(_) => Err(not_found_path()),
    }
}

fn parse_json(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if !content_type.is_empty() && content_type != "application/json" && content_type != "*/*" {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json (got {content_type:?})"),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body of the request was not JSON: {e}")))
}

fn list_kind(res: &ResourceInfo) -> String {
    format!("{}List", res.kind)
}

fn list(shared: &Shared, t: &Target, q: &Query) -> Result<(u16, Value), ApiError> {
    let sel = Selector::parse(t.res, q.get("labelSelector"), q.get("fieldSelector"))?;
    let st = shared.store.lock();
    let mut list_rv = st.resource_version();
    if let (Some(rv), Some("Exact")) = (q.get("resourceVersion"), q.get("resourceVersionMatch")) {
        let n: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?;
        if n < st.compacted() {
            return Err(ApiError::expired(format!(
                "too old resource version: {n} ({})",
                st.compacted()
            )));
        }
    }
    let mut items = st.list(t.res, t.ns.as_deref(), &sel);
    // Continue tokens: "<list RV>/<namespace>/<name>" of the last item sent.
    if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        let mut parts = token.splitn(3, '/');
        let rv: u64 = parts
            .next()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
        let last = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        if rv < st.compacted() {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ));
        }
        list_rv = rv;
        items.retain(|((_, ns, name), _)| (ns.clone(), name.clone()) > last);
    }
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some(limit) = q.get("limit").and_then(|l| l.parse::<usize>().ok()) {
        if limit > 0 && items.len() > limit {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let ((_, ns, name), _) = items.last().expect("item");
            meta["continue"] = json!(format!("{list_rv}/{ns}/{name}"));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    Ok((
        200,
        json!({
            "kind": list_kind(t.res),
            "apiVersion": t.res.api_version(),
            "metadata": meta,
            // List items carry no kind/apiVersion, as upstream's JSON lists.
            "items": items
                .into_iter()
                .map(|(_, mut v)| {
                    if let Some(o) = v.as_object_mut() {
                        o.remove("kind");
                        o.remove("apiVersion");
                    }
                    v
                })
                .collect::<Vec<_>>(),
        }),
    ))
}

fn delete(
    shared: &Shared,
    t: &Target,
    name: &str,
    q: &Query,
    body: &[u8],
) -> Result<(u16, Value), ApiError> {
    let opts_body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let mut opts = DeleteOpts {
        grace: opts_body["gracePeriodSeconds"].as_i64(),
        uid: opts_body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: opts_body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    if let Some(g) = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
        opts.grace = Some(g);
    }
    let out = shared
        .store
        .lock()
        .delete(t.res, t.ns.as_deref().unwrap_or(""), name, &opts)?;
    Ok(match out {
        Deleted::Pending(obj) => (200, obj),
        Deleted::Gone(obj) if t.res.plural == "pods" => (200, obj),
        Deleted::Gone(obj) => {
            let mut details = json!({"name": name, "kind": t.res.plural,
                "uid": obj["metadata"]["uid"]});
            if !t.res.group.is_empty() {
                details["group"] = json!(t.res.group);
            }
            (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Success", "details": details}),
            )
        }
    })
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).expect("json");
    b.push(b'\n');
    Bytes::from(b)
}

fn bookmark(res: &ResourceInfo, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta}})
}

fn start_watch(
    shared: &Arc<Shared>,
    t: &Target,
    q: &Query,
    kill: CancellationToken,
) -> Response<RespBody> {
    let sel = match Selector::parse(t.res, q.get("labelSelector"), q.get("fieldSelector")) {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let send_initial = q.flag("sendInitialEvents");
    let rv = if send_initial {
        None
    } else {
        q.get("resourceVersion")
    };
    let started = shared.store.lock().watch(t.res, t.ns.as_deref(), rv, &sel);
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let res = t.res;
    let ns = t.ns.clone();
    let bookmarks = q.flag("allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let interval = shared.bookmark_interval;
    let mut partition = shared.partition.subscribe();
    tokio::spawn(async move {
        let (initial, from, mut events) = match started {
            Ok(s) => s,
            Err(e) => {
                // As the real server: a 200 stream with one ERROR event.
                let _ = tx
                    .send(line(&json!({"type": "ERROR", "object": e.status()})))
                    .await;
                return;
            }
        };
        for ev in initial {
            if tx.send(line(&ev)).await.is_err() {
                return;
            }
        }
        if send_initial && bookmarks {
            let _ = tx.send(line(&bookmark(res, from, true))).await;
        }
        let mut seen = from;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= seen {
                            continue;
                        }
                        seen = ev.rv;
                        if let Some(v) = store::watch_event(&ev, res, ns.as_deref(), &sel) {
                            if tx.send(line(&v)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let e = ApiError::expired("the watch fell too far behind");
                        let _ = tx.send(line(&json!({"type": "ERROR", "object": e.status()}))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    if tx.send(line(&bookmark(res, seen, false))).await.is_err() {
                        return;
                    }
                }
                _ = async { tokio::time::sleep_until(deadline.expect("deadline")).await }, if deadline.is_some() => return,
                _ = async { let _ = partition.wait_for(|p| *p).await; } => {
                    // Partitioned: the connection is dropped, no ERROR event,
                    // no end of the chunked body.
                    // (tx is held until then, so the body does not end
                    // cleanly first).
                    kill.cancel();
                    tx.closed().await;
                    return;
                }
                _ = tx.closed() => return,
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(RespBody::Stream(rx))
        .expect("response")
}

fn discovery(shared: &Shared, segs: &[&str]) -> Option<Value> {
    let resources = |group: &str, version: &str| {
        let mut out = Vec::new();
        for r in store::RESOURCES
            .iter()
            .filter(|r| r.group == group && r.version == version)
        {
            out.push(
                json!({"name": r.plural, "singularName": r.kind.to_lowercase(),
                "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}),
            );
            if r.status {
                out.push(json!({"name": format!("{}/status", r.plural), "singularName": "",
                    "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
            }
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out})
    };
    Some(match segs {
        ["version"] => {
            json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-apiserver-double",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "2025-08-27T00:00:00Z",
            "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"})
        }
        ["api"] => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                "serverAddress": format!("127.0.0.1:{}", shared.port)}]}),
        ["api", "v1"] => resources("", "v1"),
        ["apis"] => {
            // Each group with every version it serves, v1 preferred.
            let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
            for r in store::RESOURCES.iter().filter(|r| !r.group.is_empty()) {
                match groups.iter_mut().find(|(g, _)| *g == r.group) {
                    Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version),
                    Some(_) => {}
                    None => groups.push((r.group, vec![r.version])),
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(g, mut vs)| {
                    vs.sort_by_key(|v| *v != "v1");
                    let gvs: Vec<Value> = vs
                        .iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": gvs, "preferredVersion": gvs[0]})
                })
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        ["apis", g, v]
            if store::RESOURCES
                .iter()
                .any(|r| r.group == *g && r.version == *v) =>
        {
            resources(g, v)
        }
        _ => return None,
    })
}

type ReviewFn = fn(&Shared, Value) -> Result<Value, ApiError>;

/// TokenReview create (`pkg/registry/authentication/tokenreview`): never
/// stored; an empty token is a 400; the answer is the object with
/// `status` filled in, 201 Created. An unknown token is
/// `authenticated: false` with an error, as the real authenticators say.
fn token_review(shared: &Shared, mut obj: Value) -> Result<Value, ApiError> {
    let token = obj
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let audiences: Vec<String> = obj
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let issued = serviceaccount::review(&shared.store.lock(), &token, &audiences);
    let added = shared.reviews.lock().tokens.get(&token).cloned();
    let status = match (issued, added) {
        (Some(status), _) => status,
        (None, Some((user, uid, groups))) => json!({
            "authenticated": true,
            "user": {"username": user, "uid": uid, "groups": groups},
            "audiences": [serviceaccount::API_AUDIENCE],
        }),
        (None, None) => {
            json!({"user": {}, "error": "[invalid bearer token, token lookup failed]"})
        }
    };
    obj["status"] = status;
    obj["metadata"] = json!({"creationTimestamp": null});
    Ok(obj)
}

/// SubjectAccessReview create (`pkg/registry/authorization/subjectaccessreview`):
/// never stored; a spec without user and groups, or with both or neither
/// of resourceAttributes/nonResourceAttributes, is 422 Invalid; 201 with
/// `status.allowed`.
fn access_review(shared: &Shared, mut obj: Value) -> Result<Value, ApiError> {
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups = spec
        .get("groups")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ra = spec.get("resourceAttributes");
    let nra = spec.get("nonResourceAttributes");
    let invalid = |msg: &str| {
        ApiError::new(
            422,
            "Invalid",
            format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {msg}"),
        )
    };
    if user.is_empty() && groups == 0 {
        return Err(invalid(
            "spec.user: Invalid value: \"\": at least one of user or group must be specified",
        ));
    }
    if ra.is_some() == nra.is_some() {
        return Err(invalid("spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified"));
    }
    let field = |k: &str| {
        ra.and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let want = [
        user.to_string(),
        field("verb"),
        field("resource"),
        field("subresource"),
    ];
    let allowed = shared.reviews.lock().allow.iter().any(|rule| {
        rule.iter()
            .zip(want.iter())
            .all(|(r, w)| r == "*" || r == w)
    });
    obj["status"] = if allowed {
        json!({"allowed": true, "reason": "allowed by the double's rules"})
    } else {
        json!({"allowed": false})
    };
    obj["metadata"] = json!({"creationTimestamp": null});
    Ok(obj)
}
