//! Authentication and authorization of :10250, as upstream's kubelet
//! server (`pkg/kubelet/server/auth.go`, `server.go` InstallAuthFilter,
//! and the delegating authenticator/authorizer of `k8s.io/apiserver`):
//! x509 client certificates against `clientCAFile`, bearer tokens through
//! TokenReview, anonymous requests only when enabled; `AlwaysAllow` or a
//! SubjectAccessReview per request for `nodes/<subresource>`, cached.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use super::https::PeerCerts;
use crate::apiclient::ApiClient;

/// Entries kept per cache; beyond it, expired entries go, then the oldest.
const CACHE_CAP: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no client provided, cannot use webhook authentication")]
    NoClientForAuthn,
    #[error("no client provided, cannot use webhook authorization")]
    NoClientForAuthz,
    #[error("unknown authorization mode {0}")]
    UnknownMode(String),
    #[error("no authorization mode specified")]
    NoMode,
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    fn anonymous() -> Self {
        UserInfo {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// The authorizer attributes of one check (`authorizer.AttributesRecord`
/// as the kubelet fills it: resource `nodes`, name the node).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: String,
    pub subresource: &'static str,
}

/// Maps a request to the checks upstream makes, in order: a request is
/// allowed when any of them is. `/stats`, `/metrics`, `/logs` and
/// `/checkpoint` get their own subresource; with `KubeletFineGrainedAuthz` (default on since
/// v1.33), `/pods` and `/runningpods` try `pods`, `/healthz` `healthz` and
/// `/configz` `configz` before `proxy`; everything else is `proxy`.
pub fn request_attributes(method: &Method, path: &str, fine_grained: bool) -> Vec<Attributes> {
    let verb = match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
    .to_string();
    let sub = |subresource| Attributes {
        verb: verb.clone(),
        subresource,
    };
    let is_sub = |prefix: &str| {
        let prefix = prefix.trim_end_matches('/');
        path == prefix
            || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
    };
    if is_sub("/stats") {
        return vec![sub("stats")];
    }
    if is_sub("/metrics") {
        return vec![sub("metrics")];
    }
    if is_sub("/logs") {
        return vec![sub("log")];
    }
    if is_sub("/checkpoint") {
        return vec![sub("checkpoint")];
    }
    if fine_grained {
        let first = if is_sub("/pods") || is_sub("/runningpods") {
            Some("pods")
        } else if is_sub("/healthz") {
            Some("healthz")
        } else if is_sub("/configz") {
            Some("configz")
        } else {
            None
        };
        if let Some(f) = first {
            return vec![sub(f), sub("proxy")];
        }
    }
    vec![sub("proxy")]
}

/// A small TTL cache (bounded: hostile clients sending fresh tokens cost
/// at most `CACHE_CAP` entries).
struct TtlCache<K, V> {
    map: HashMap<K, (Instant, V)>,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            map: HashMap::new(),
        }
    }

    fn get(&mut self, k: &K) -> Option<V> {
        match self.map.get(k) {
            Some((until, v)) if *until > Instant::now() => Some(v.clone()),
            Some(_) => {
                self.map.remove(k);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, k: K, v: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        if self.map.len() >= CACHE_CAP {
            let now = Instant::now();
            self.map.retain(|_, (until, _)| *until > now);
            if self.map.len() >= CACHE_CAP {
                if let Some(oldest) = self
                    .map
                    .iter()
                    .min_by_key(|(_, (until, _))| *until)
                    .map(|(k, _)| k.clone())
                {
                    self.map.remove(&oldest);
                }
            }
        }
        self.map.insert(k, (Instant::now() + ttl, v));
    }
}

/// The settings of `authentication` and `authorization`.
pub struct AuthConfig {
    pub anonymous: bool,
    pub webhook_authn: bool,
    pub authn_cache_ttl: Duration,
    pub client_ca: Option<Arc<super::https::ClientCa>>,
    pub webhook_authz: bool,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
    pub fine_grained: bool,
    pub node_name: String,
}

/// The authenticator and authorizer of :10250.
pub struct Auth {
    cfg: AuthConfig,
    /// Set once cluster mode has built its API client (after TLS
    /// bootstrap); until then webhook checks fail closed.
    api: Arc<OnceLock<ApiClient>>,
    tokens: Mutex<TtlCache<String, Option<UserInfo>>>,
    decisions: Mutex<TtlCache<(UserInfo, Attributes), bool>>,
}

impl Auth {
    /// Checks the configuration as upstream's BuildAuth does: webhook
    /// authentication or authorization need an API client (`--kubeconfig`).
    pub fn new(
        cfg: &crate::config::KubeletConfiguration,
        node_name: &str,
        client_ca: Option<Arc<super::https::ClientCa>>,
        has_api: bool,
        api: Arc<OnceLock<ApiClient>>,
    ) -> Result<Arc<Self>, AuthError> {
        let webhook_authn = cfg.authentication.webhook.enabled;
        if webhook_authn && !has_api {
            return Err(AuthError::NoClientForAuthn);
        }
        let webhook_authz = match cfg.authorization.mode.as_str() {
            "AlwaysAllow" => false,
            "Webhook" if has_api => true,
            "Webhook" => return Err(AuthError::NoClientForAuthz),
            "" => return Err(AuthError::NoMode),
            other => return Err(AuthError::UnknownMode(other.into())),
        };
        let fine_grained = cfg.feature_gate("KubeletFineGrainedAuthz");
        Ok(Arc::new(Auth {
            cfg: AuthConfig {
                anonymous: cfg.authentication.anonymous.enabled,
                webhook_authn,
                authn_cache_ttl: cfg.authentication.webhook.cache_ttl.0,
                client_ca,
                webhook_authz,
                authorized_ttl: cfg.authorization.webhook.cache_authorized_ttl.0,
                unauthorized_ttl: cfg.authorization.webhook.cache_unauthorized_ttl.0,
                fine_grained,
                node_name: node_name.into(),
            },
            api,
            tokens: Mutex::new(TtlCache::new()),
            decisions: Mutex::new(TtlCache::new()),
        }))
    }

    /// Who sent the request; `None` means 401.
    pub async fn authenticate(
        &self,
        certs: Option<&PeerCerts>,
        bearer: Option<&str>,
    ) -> Option<UserInfo> {
        if let (Some(ca), Some(PeerCerts(chain))) = (&self.cfg.client_ca, certs) {
            if let Some((end, rest)) = chain.split_first() {
                let verifier = ca.verifier();
                match verifier.verify_client_cert(end, rest, rustls::pki_types::UnixTime::now()) {
                    Ok(_) => return Some(with_authenticated(cert_user(end.as_ref())?)),
                    Err(e) => {
                        // As the x509 authenticator: an unverifiable
                        // certificate fails the request unless a token
                        // authenticates it.
                        debug!(error = %e, "client certificate not verified");
                        if bearer.is_none() || !self.cfg.webhook_authn {
                            return None;
                        }
                    }
                }
            }
        }
        if let (Some(token), true) = (bearer, self.cfg.webhook_authn) {
            return self.review_token(token).await.map(with_authenticated);
        }
        self.cfg.anonymous.then(UserInfo::anonymous)
    }

    async fn review_token(&self, token: &str) -> Option<UserInfo> {
        if let Some(hit) = self.tokens.lock().get(&token.to_string()) {
            return hit;
        }
        let api = self.api.get()?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                audiences: None,
            },
            ..Default::default()
        };
        let client = api.client().await;
        let reviews: kube::Api<TokenReview> = kube::Api::all(client);
        let answer = match reviews.create(&Default::default(), &review).await {
            Ok(r) => r,
            Err(e) => {
                // Errors are not cached: the next request asks again.
                warn!(error = %e, "TokenReview failed");
                return None;
            }
        };
        let status = answer.status.unwrap_or_default();
        let user = if status.authenticated == Some(true) {
            status.user.map(|u| UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
            })
        } else {
            None
        };
        self.tokens
            .lock()
            .put(token.to_string(), user.clone(), self.cfg.authn_cache_ttl);
        user
    }

    /// Whether `user` may make a request with these checks; `Err` is an
    /// authorization error (upstream's 500).
    pub async fn authorize(
        &self,
        user: &UserInfo,
        checks: &[Attributes],
    ) -> Result<bool, Attributes> {
        if !self.cfg.webhook_authz {
            return Ok(true);
        }
        for a in checks {
            match self.review_access(user, a).await {
                Some(true) => return Ok(true),
                Some(false) => {}
                None => return Err(a.clone()),
            }
        }
        Ok(false)
    }

    async fn review_access(&self, user: &UserInfo, a: &Attributes) -> Option<bool> {
        let key = (user.clone(), a.clone());
        if let Some(hit) = self.decisions.lock().get(&key) {
            return Some(hit);
        }
        let api = self.api.get()?;
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(a.verb.clone()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(a.subresource.into()),
                    name: Some(self.cfg.node_name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let client = api.client().await;
        let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(client);
        let answer = match reviews.create(&Default::default(), &sar).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "SubjectAccessReview failed");
                return None;
            }
        };
        let Some(allowed) = decision(answer.status.as_ref()) else {
            warn!("SubjectAccessReview returned both allow and deny");
            return None;
        };
        let ttl = if allowed {
            self.cfg.authorized_ttl
        } else {
            self.cfg.unauthorized_ttl
        };
        self.decisions.lock().put(key, allowed, ttl);
        Some(allowed)
    }
}

/// A review's answer: allowed or not; `None` when it says both, which
/// upstream's webhook authorizer takes for an error (a 500, not cached).
fn decision(
    status: Option<&k8s_openapi::api::authorization::v1::SubjectAccessReviewStatus>,
) -> Option<bool> {
    match status {
        Some(s) if s.allowed && s.denied == Some(true) => None,
        Some(s) => Some(s.allowed),
        None => Some(false),
    }
}

/// Upstream's authenticator adds `system:authenticated` to every user it
/// authenticated (not to anonymous).
fn with_authenticated(mut u: UserInfo) -> UserInfo {
    if !u.groups.iter().any(|g| g == "system:authenticated") {
        u.groups.push("system:authenticated".into());
    }
    u
}

/// The x509 authenticator's user: CN is the name, each O a group.
fn cert_user(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(UserInfo {
        name,
        uid: String::new(),
        groups,
    })
}

fn plain(code: StatusCode, msg: String) -> Response {
    // Upstream writes these with go-restful's WriteErrorString: the
    // message as text.
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

/// The filter in front of every :10250 handler (upstream's
/// InstallAuthFilter): 401 `Unauthorized`, 403 `Forbidden (user=…, verb=…,
/// resource=nodes, subresource(s)=[…])` naming every subresource tried,
/// 500 on an authorization error.
pub async fn filter(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        })
        .filter(|t| !t.is_empty());
    let certs = req.extensions().get::<PeerCerts>().cloned();
    let Some(user) = auth.authenticate(certs.as_ref(), bearer.as_deref()).await else {
        return plain(StatusCode::UNAUTHORIZED, "Unauthorized".into());
    };
    let checks = request_attributes(req.method(), req.uri().path(), auth.cfg.fine_grained);
    match auth.authorize(&user, &checks).await {
        Ok(true) => next.run(req).await,
        Ok(false) => {
            // Every subresource tried, as Go prints a []string, and a
            // newline: upstream's message since fine-grained checks came.
            let subs: Vec<&str> = checks.iter().map(|a| a.subresource).collect();
            let verb = checks.first().map_or("", |a| a.verb.as_str());
            let msg = format!(
                "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
                user.name,
                subs.join(" ")
            );
            info!(path = %req.uri().path(), "{}", msg.trim_end());
            plain(StatusCode::FORBIDDEN, msg)
        }
        Err(a) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                user.name, a.verb, a.subresource
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs(method: Method, path: &str, fine: bool) -> Vec<&'static str> {
        request_attributes(&method, path, fine)
            .into_iter()
            .map(|a| a.subresource)
            .collect()
    }

    /// An answer both allowed and denied is an error, as upstream's webhook
    /// authorizer returns it; it was taken for allowed before.
    #[test]
    fn a_review_both_allowed_and_denied_is_an_error() {
        use k8s_openapi::api::authorization::v1::SubjectAccessReviewStatus as St;
        let st = |allowed, denied| St {
            allowed,
            denied,
            ..Default::default()
        };
        assert_eq!(decision(Some(&st(true, Some(true)))), None);
        assert_eq!(decision(Some(&st(true, None))), Some(true));
        assert_eq!(decision(Some(&st(true, Some(false)))), Some(true));
        assert_eq!(decision(Some(&st(false, Some(true)))), Some(false));
        assert_eq!(decision(None), Some(false));
    }

    #[test]
    fn paths_map_to_node_subresources_as_upstream() {
        assert_eq!(subs(Method::GET, "/stats/summary", true), ["stats"]);
        assert_eq!(subs(Method::GET, "/stats", true), ["stats"]);
        // isSubpath: a prefix that is not a path segment is not a match.
        assert_eq!(subs(Method::GET, "/statsx", true), ["proxy"]);
        assert_eq!(subs(Method::GET, "/metrics/cadvisor", true), ["metrics"]);
        assert_eq!(subs(Method::GET, "/logs/syslog", true), ["log"]);
        // Its own subresource, not proxy (upstream's GetRequestAttributes).
        assert_eq!(
            subs(Method::POST, "/checkpoint/ns/p/c", true),
            ["checkpoint"]
        );
        assert_eq!(
            subs(Method::POST, "/checkpoint/ns/p/c", false),
            ["checkpoint"]
        );
        assert_eq!(subs(Method::GET, "/pods", true), ["pods", "proxy"]);
        assert_eq!(subs(Method::GET, "/runningpods/", true), ["pods", "proxy"]);
        assert_eq!(subs(Method::GET, "/healthz", true), ["healthz", "proxy"]);
        assert_eq!(subs(Method::GET, "/configz", true), ["configz", "proxy"]);
        assert_eq!(subs(Method::GET, "/pods", false), ["proxy"]);
        assert_eq!(subs(Method::POST, "/exec/ns/p/c", true), ["proxy"]);
        let verbs: Vec<String> = [
            Method::POST,
            Method::GET,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ]
        .iter()
        .map(|m| request_attributes(m, "/x", true)[0].verb.clone())
        .collect();
        assert_eq!(verbs, ["create", "get", "update", "patch", "delete"]);
    }

    #[test]
    fn the_ttl_cache_expires_and_stays_bounded() {
        let mut c: TtlCache<u32, bool> = TtlCache::new();
        c.put(1, true, Duration::from_secs(60));
        assert_eq!(c.get(&1), Some(true));
        c.put(2, true, Duration::ZERO);
        assert_eq!(c.get(&2), None, "a zero TTL caches nothing");
        c.put(3, true, Duration::from_nanos(1));
        std::thread::yield_now();
        for i in 10..(10 + CACHE_CAP as u32 * 2) {
            c.put(i, false, Duration::from_secs(60));
        }
        assert!(c.map.len() <= CACHE_CAP);
    }

    fn config(yaml: &str) -> crate::config::KubeletConfiguration {
        crate::config::KubeletConfiguration::load_str(&format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}"
        ))
        .expect("config")
        .0
    }

    #[test]
    fn webhook_modes_need_an_api_client_as_upstream() {
        let api = Arc::new(OnceLock::new());
        let cfg = config("authentication:\n  webhook:\n    enabled: true\n");
        assert!(matches!(
            Auth::new(&cfg, "n", None, false, api.clone()),
            Err(AuthError::NoClientForAuthn)
        ));
        let cfg = config(
            "authentication:\n  webhook:\n    enabled: false\nauthorization:\n  mode: Webhook\n",
        );
        assert!(matches!(
            Auth::new(&cfg, "n", None, false, api.clone()),
            Err(AuthError::NoClientForAuthz)
        ));
        let cfg = config(
            "authentication:\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
        );
        assert!(Auth::new(&cfg, "n", None, false, api).is_ok());
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled() {
        let api = Arc::new(OnceLock::new());
        let on = config("authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n");
        let a = Auth::new(&on, "n", None, false, api.clone()).unwrap();
        assert_eq!(
            a.authenticate(None, None).await,
            Some(UserInfo::anonymous())
        );
        let off = config("authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n");
        let a = Auth::new(&off, "n", None, false, api.clone()).unwrap();
        assert_eq!(a.authenticate(None, None).await, None);
        // Webhook authentication whose client is not built yet fails closed.
        let hook = config("authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: true\nauthorization:\n  mode: AlwaysAllow\n");
        let a = Auth::new(&hook, "n", None, true, api).unwrap();
        assert_eq!(a.authenticate(None, Some("tok")).await, None);
    }
}
