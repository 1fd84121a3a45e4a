//! Authentication and authorization of :10250, as upstream's kubelet
//! server (`pkg/kubelet/server/auth.go`, `server.go` InstallAuthFilter,
//! and the delegating authenticator/authorizer of `k8s.io/apiserver`):
//! x509 client certificates against `clientCAFile`, bearer tokens through
//! TokenReview, anonymous requests only when enabled; `AlwaysAllow` or a
//! SubjectAccessReview per request for `nodes/<subresource>`, cached.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use super::https::PeerCerts;
use super::restful_text as plain;
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
    #[error("no authentication method configured")]
    NoMethod,
}

/// Who made a request (upstream's `user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// Extra attributes (a token's from its TokenReview; an x509 user's
    /// credential ID), passed on to the SubjectAccessReview.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    fn anonymous() -> Self {
        UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..Default::default()
        }
    }
}

/// One authenticator's answer, as upstream's `(user, ok, err)`: a user, no
/// opinion (the next one is asked), or a failure (the next one is still
/// asked, but no anonymous fallback follows).
#[derive(Debug, PartialEq)]
enum Answer {
    User(UserInfo),
    NoOpinion,
    Failed(String),
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
    /// `AllowParsingUserUIDFromCertAuth`: a certificate's subject
    /// attribute 1.3.6.1.4.1.57683.2 is the user's UID.
    pub uid_from_cert: bool,
    pub webhook_authz: bool,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
    pub fine_grained: bool,
    pub node_name: String,
}

/// Why a review could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Cluster mode has not built its client yet (before TLS bootstrap):
    /// webhook checks fail closed.
    #[error("no API client yet")]
    NoClient,
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Where TokenReviews and SubjectAccessReviews go: the API server, or a
/// fake in unit tests.
#[async_trait::async_trait]
pub trait Reviewer: Send + Sync {
    async fn token_review(&self, review: TokenReview) -> Result<TokenReview, ReviewError>;
    async fn access_review(
        &self,
        review: SubjectAccessReview,
    ) -> Result<SubjectAccessReview, ReviewError>;
}

/// The API server behind cluster mode's client, once it is built.
struct ApiReviewer(Arc<OnceLock<ApiClient>>);

#[async_trait::async_trait]
impl Reviewer for ApiReviewer {
    async fn token_review(&self, review: TokenReview) -> Result<TokenReview, ReviewError> {
        let api = self.0.get().ok_or(ReviewError::NoClient)?;
        let reviews: kube::Api<TokenReview> = kube::Api::all(api.client().await);
        Ok(reviews.create(&Default::default(), &review).await?)
    }

    async fn access_review(
        &self,
        review: SubjectAccessReview,
    ) -> Result<SubjectAccessReview, ReviewError> {
        let api = self.0.get().ok_or(ReviewError::NoClient)?;
        let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(api.client().await);
        Ok(reviews.create(&Default::default(), &review).await?)
    }
}

/// Upstream's DefaultAuthWebhookRetryBackoff: 500 ms, ×1.5 per step, up
/// to 20 % jitter, five attempts in all.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_FACTOR: f64 = 1.5;
const RETRY_JITTER: f64 = 0.2;
const RETRY_ATTEMPTS: u32 = 5;
/// The token cache's bound on one lookup (upstream's sharedLookupTimeout).
const TOKEN_LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The Status reasons apimachinery knows; a 500 or 504 with any other
/// reason counts as an internal error or a timeout.
const KNOWN_REASONS: [&str; 19] = [
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "StoreReadError",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
    "Expired",
    "ServiceUnavailable",
];

/// Upstream's webhook DefaultShouldRetry: a reset connection, an internal
/// error, a timeout, 429, or a server asking to be retried later. A
/// refused connection or any other status is final.
fn should_retry(e: &ReviewError) -> bool {
    let ReviewError::Api(e) = e else {
        return false;
    };
    if let kube::Error::Api(s) = e {
        let unknown = !KNOWN_REASONS.contains(&s.reason.as_str());
        let delay = s
            .details
            .as_ref()
            .is_some_and(|d| s.reason == "ServerTimeout" || d.retry_after_seconds > 0);
        return s.reason == "InternalError"
            || (s.code == 500 && unknown)
            || s.reason == "Timeout"
            || (s.code == 504 && unknown)
            || s.reason == "TooManyRequests"
            || s.code == 429
            || delay;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionReset {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// A uniform draw in [0, 1) from the process's random hasher keys.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let h = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Calls `call` until it succeeds, fails for good, or has been tried
/// `RETRY_ATTEMPTS` times (upstream's WithExponentialBackoff), so a blip
/// of the API server does not turn into 401s and 500s.
async fn with_retries<T, F, Fut>(what: &str, mut call: F) -> Result<T, ReviewError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ReviewError>>,
{
    let mut delay = RETRY_FIRST;
    let mut attempt = 1;
    loop {
        match call().await {
            Err(e) if attempt < RETRY_ATTEMPTS && should_retry(&e) => {
                let wait = delay.mul_f64(1.0 + RETRY_JITTER * unit_random());
                debug!(error = %e, attempt, ?wait, "{what} failed; retrying");
                tokio::time::sleep(wait).await;
                delay = delay.mul_f64(RETRY_FACTOR);
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// The authenticator and authorizer of :10250.
pub struct Auth {
    cfg: AuthConfig,
    reviewer: Arc<dyn Reviewer>,
    tokens: Mutex<TtlCache<String, Option<UserInfo>>>,
    decisions: Mutex<TtlCache<(UserInfo, Attributes), bool>>,
}

impl Auth {
    /// Checks the configuration as upstream's BuildAuth does: webhook
    /// authentication or authorization need an API client (`--kubeconfig`),
    /// and some way to authenticate must be on. Webhook reviews go to
    /// cluster mode's client, set once built (after TLS bootstrap).
    pub fn new(
        cfg: &crate::config::KubeletConfiguration,
        node_name: &str,
        client_ca: Option<Arc<super::https::ClientCa>>,
        has_api: bool,
        api: Arc<OnceLock<ApiClient>>,
    ) -> Result<Arc<Self>, AuthError> {
        Self::with_reviewer(
            cfg,
            node_name,
            client_ca,
            has_api,
            Arc::new(ApiReviewer(api)),
        )
    }

    pub fn with_reviewer(
        cfg: &crate::config::KubeletConfiguration,
        node_name: &str,
        client_ca: Option<Arc<super::https::ClientCa>>,
        has_api: bool,
        reviewer: Arc<dyn Reviewer>,
    ) -> Result<Arc<Self>, AuthError> {
        let webhook_authn = cfg.authentication.webhook.enabled;
        if webhook_authn && !has_api {
            return Err(AuthError::NoClientForAuthn);
        }
        let anonymous = cfg.authentication.anonymous.enabled;
        // DelegatingAuthenticatorConfig.New: neither a client CA nor a
        // token webhook, and anonymous off, would refuse every request.
        if client_ca.is_none() && !webhook_authn && !anonymous {
            return Err(AuthError::NoMethod);
        }
        let webhook_authz = match cfg.authorization.mode.as_str() {
            "AlwaysAllow" => false,
            "Webhook" if has_api => true,
            "Webhook" => return Err(AuthError::NoClientForAuthz),
            "" => return Err(AuthError::NoMode),
            other => return Err(AuthError::UnknownMode(other.into())),
        };
        Ok(Arc::new(Auth {
            cfg: AuthConfig {
                anonymous,
                webhook_authn,
                authn_cache_ttl: cfg.authentication.webhook.cache_ttl.0,
                client_ca,
                uid_from_cert: cfg.feature_gate("AllowParsingUserUIDFromCertAuth"),
                webhook_authz,
                authorized_ttl: cfg.authorization.webhook.cache_authorized_ttl.0,
                unauthorized_ttl: cfg.authorization.webhook.cache_unauthorized_ttl.0,
                fine_grained: cfg.feature_gate("KubeletFineGrainedAuthz"),
                node_name: node_name.into(),
            },
            reviewer,
            tokens: Mutex::new(TtlCache::new()),
            decisions: Mutex::new(TtlCache::new()),
        }))
    }

    /// Who sent the request, as upstream's delegating authenticator: the
    /// client certificate, then the bearer token, then a token in the
    /// WebSocket subprotocol; the first that names a user wins. If none
    /// does and none failed, the request is anonymous when that is on.
    /// `Err` (why, for the log) means 401. A token that authenticated is
    /// taken out of the headers, so it is not passed on to the runtime.
    pub async fn authenticate(
        &self,
        certs: Option<&PeerCerts>,
        headers: &mut HeaderMap,
    ) -> Result<UserInfo, String> {
        let mut failures = Vec::new();
        match self.x509(certs) {
            Answer::User(u) => return Ok(with_authenticated(u)),
            Answer::Failed(e) => failures.push(e),
            Answer::NoOpinion => {}
        }
        if self.cfg.webhook_authn {
            if let Some(token) = bearer_token(headers) {
                match self.token_user(&token).await {
                    Ok(u) => {
                        headers.remove(header::AUTHORIZATION);
                        return Ok(with_authenticated(u));
                    }
                    Err(e) => failures.push(e),
                }
            }
            match protocol_token(headers) {
                Ok(None) => {}
                Err(e) => failures.push(e),
                Ok(Some((token, others))) => match self.token_user(&token).await {
                    Ok(u) => {
                        match HeaderValue::from_str(&others) {
                            Ok(v) => headers.insert(header::SEC_WEBSOCKET_PROTOCOL, v),
                            Err(_) => headers.remove(header::SEC_WEBSOCKET_PROTOCOL),
                        };
                        return Ok(with_authenticated(u));
                    }
                    Err(e) => failures.push(e),
                },
            }
        }
        if !failures.is_empty() {
            return Err(failures.join(", "));
        }
        if self.cfg.anonymous {
            Ok(UserInfo::anonymous())
        } else {
            Err("no credentials".into())
        }
    }

    /// upstream's x509 authenticator with CommonNameUserConversion.
    fn x509(&self, certs: Option<&PeerCerts>) -> Answer {
        let (Some(ca), Some(PeerCerts(chain))) = (&self.cfg.client_ca, certs) else {
            return Answer::NoOpinion;
        };
        let Some((end, rest)) = chain.split_first() else {
            return Answer::NoOpinion;
        };
        let verifier = ca.verifier();
        match verifier.verify_client_cert(end, rest, rustls::pki_types::UnixTime::now()) {
            Ok(_) => cert_user(end.as_ref(), self.cfg.uid_from_cert),
            Err(e) => Answer::Failed(format!("verifying certificate failed: {e}")),
        }
    }

    /// A bearer token's user through the (cached) token review; a token
    /// the review does not authenticate is upstream's "invalid bearer
    /// token".
    async fn token_user(&self, token: &str) -> Result<UserInfo, String> {
        self.review_token(token)
            .await?
            .ok_or_else(|| "invalid bearer token".into())
    }

    /// The token webhook behind upstream's cache: an answer (authenticated
    /// or not) is cached for `cacheTTL`; an error, or a review that says
    /// why it failed (`status.error`), is not.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, String> {
        if let Some(hit) = self.tokens.lock().get(&token.to_string()) {
            return Ok(hit);
        }
        // No audiences: the kubelet's filter sets none on the request.
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                audiences: None,
            },
            ..Default::default()
        };
        let asked = with_retries("TokenReview", || self.reviewer.token_review(review.clone()));
        let answer = match tokio::time::timeout(TOKEN_LOOKUP_TIMEOUT, asked).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                warn!(error = %e, "Failed to make webhook authenticator request");
                return Err(e.to_string());
            }
            Err(_) => return Err(ReviewError::Timeout(TOKEN_LOOKUP_TIMEOUT).to_string()),
        };
        let status = answer.status.unwrap_or_default();
        let user = if status.authenticated == Some(true) {
            let u = status.user.unwrap_or_default();
            Some(UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            })
        } else if let Some(e) = status.error.filter(|e| !e.is_empty()) {
            return Err(e);
        } else {
            None
        };
        self.tokens
            .lock()
            .put(token.to_string(), user.clone(), self.cfg.authn_cache_ttl);
        Ok(user)
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
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
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
        let asked = with_retries("SubjectAccessReview", || {
            self.reviewer.access_review(sar.clone())
        });
        let answer = match asked.await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "Failed to make webhook authorizer request");
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

/// Upstream's AuthenticatedGroupAdder: `system:authenticated` for every
/// user an authenticator named, unless already grouped either way.
fn with_authenticated(mut u: UserInfo) -> UserInfo {
    let grouped = u
        .groups
        .iter()
        .any(|g| g == "system:authenticated" || g == "system:unauthenticated");
    if u.name != "system:anonymous" && !grouped {
        u.groups.push("system:authenticated".into());
    }
    u
}

/// The subject attribute upstream reads a certificate user's UID from.
const UID_OID: &str = "1.3.6.1.4.1.57683.2";
/// The Extra key of the credential a user authenticated with.
const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// The x509 authenticator's user (upstream's CommonNameUserConversion):
/// the subject's CN is the name (the last CN, as Go's pkix.Name keeps it),
/// each O a group, the credential ID the SHA-256 of the certificate; no CN
/// is no opinion. With `uid_from_cert`, the UID attribute is the UID (at
/// most one, and not empty).
fn cert_user(der: &[u8], uid_from_cert: bool) -> Answer {
    let cert = match x509_parser::parse_x509_certificate(der) {
        Ok((_, c)) => c,
        Err(e) => return Answer::Failed(format!("parsing certificate: {e}")),
    };
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .last()
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return Answer::NoOpinion;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    let mut uid = String::new();
    if uid_from_cert {
        let mut uids = Vec::new();
        for attr in subject
            .iter_attributes()
            .filter(|a| a.attr_type().to_id_string() == UID_OID)
        {
            match attr.as_str() {
                Ok(v) => uids.push(v.to_string()),
                Err(_) => return Answer::Failed("unable to parse UID into a string".into()),
            }
        }
        if uids.len() > 1 {
            return Answer::Failed(format!(
                "expected 1 UID, but found multiple: [{}]",
                uids.join(" ")
            ));
        }
        if let Some(u) = uids.pop() {
            if u.is_empty() {
                return Answer::Failed("UID cannot be an empty string".into());
            }
            uid = u;
        }
    }
    use sha2::Digest;
    let fingerprint: String = sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Answer::User(UserInfo {
        name,
        uid,
        groups,
        extra: BTreeMap::from([(
            CREDENTIAL_ID.to_string(),
            vec![format!("X509SHA256={fingerprint}")],
        )]),
    })
}

/// The token of `Authorization: Bearer <token>` as upstream's bearertoken
/// authenticator reads it: the first header, trimmed, split at single
/// spaces; the scheme in any case; an empty token is no token.
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = v.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

/// The prefix of a WebSocket subprotocol that carries a bearer token
/// (browsers cannot set an Authorization header on a WebSocket).
const BEARER_PROTOCOL: &str = "base64url.bearer.authorization.k8s.io.";

/// A token sent as a WebSocket subprotocol (upstream's websocket protocol
/// authenticator): only on a WebSocket upgrade; the token base64url
/// without padding; exactly one such protocol, beside at least one real
/// one. Returns the token and the header's other protocols.
fn protocol_token(headers: &HeaderMap) -> Result<Option<(String, String)>, String> {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().to_ascii_lowercase().contains(token))
            })
        })
    };
    let upgrade_is_ws = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade_is_ws || !has(header::CONNECTION, "upgrade") {
        return Ok(None);
    }
    let mut token = None;
    let mut others = Vec::new();
    for v in headers.get_all(header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(v) = v.to_str() else { continue };
        for p in v.split(',').map(str::trim) {
            let Some(encoded) = p.strip_prefix(BEARER_PROTOCOL) else {
                others.push(p);
                continue;
            };
            if token.is_some() {
                return Err("multiple base64.bearer.authorization tokens specified".into());
            }
            use base64::Engine;
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded)
                .map_err(|_| "invalid base64.bearer.authorization token encoding".to_string())?;
            let t = String::from_utf8(raw)
                .map_err(|_| "invalid base64.bearer.authorization token".to_string())?;
            token = Some(t);
        }
    }
    let Some(token) = token else {
        return Ok(None);
    };
    if others.is_empty() {
        return Err("missing additional subprotocol".into());
    }
    if token.is_empty() {
        return Ok(None);
    }
    Ok(Some((token, others.join(","))))
}

/// The filter in front of every :10250 handler (upstream's
/// InstallAuthFilter): 401 `Unauthorized`, 403 `Forbidden (user=…, verb=…,
/// resource=nodes, subresource(s)=[…])` naming every subresource tried,
/// 500 on an authorization error.
pub async fn filter(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let certs = req.extensions().get::<PeerCerts>().cloned();
    let user = match auth.authenticate(certs.as_ref(), req.headers_mut()).await {
        Ok(u) => u,
        Err(e) => {
            debug!(path = %req.uri().path(), reason = %e, "Unable to authenticate the request");
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized".into());
        }
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

    use crate::testutil::kubelet_config as config;

    #[test]
    fn webhook_modes_need_an_api_client_as_upstream() {
        let api = Arc::new(OnceLock::new());
        let cfg = config("authentication:\n  webhook:\n    enabled: true\n");
        assert!(matches!(
            Auth::new(&cfg, "n", None, false, api.clone()),
            Err(AuthError::NoClientForAuthn)
        ));
        let cfg = config(
            "authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: Webhook\n",
        );
        assert!(matches!(
            Auth::new(&cfg, "n", None, false, api.clone()),
            Err(AuthError::NoClientForAuthz)
        ));
        // DelegatingAuthenticatorConfig.New: no client CA, no webhook and
        // anonymous off leave no way in, which is refused at startup.
        let cfg = config(
            "authentication:\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
        );
        assert!(matches!(
            Auth::new(&cfg, "n", None, false, api.clone()),
            Err(AuthError::NoMethod)
        ));
        let cfg = config(
            "authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
        );
        assert!(Auth::new(&cfg, "n", None, false, api).is_ok());
    }

    /// Answers reviews from a script (the last answer repeats) and keeps
    /// what it was asked.
    #[derive(Default)]
    struct Script {
        tokens: Mutex<Vec<Result<TokenReview, ReviewError>>>,
        access: Mutex<Vec<Result<SubjectAccessReview, ReviewError>>>,
        asked_tokens: Mutex<Vec<TokenReview>>,
        asked_access: Mutex<Vec<SubjectAccessReview>>,
    }

    fn next<T: Clone>(script: &Mutex<Vec<Result<T, ReviewError>>>) -> Result<T, ReviewError> {
        let mut s = script.lock();
        let r = s.remove(0);
        let again = match &r {
            Ok(v) => Ok(v.clone()),
            Err(ReviewError::Api(kube::Error::Api(st))) => {
                Err(ReviewError::Api(kube::Error::Api(st.clone())))
            }
            Err(_) => Err(ReviewError::NoClient),
        };
        if s.is_empty() {
            s.push(again);
        }
        r
    }

    #[async_trait::async_trait]
    impl Reviewer for Script {
        async fn token_review(&self, review: TokenReview) -> Result<TokenReview, ReviewError> {
            self.asked_tokens.lock().push(review);
            next(&self.tokens)
        }
        async fn access_review(
            &self,
            review: SubjectAccessReview,
        ) -> Result<SubjectAccessReview, ReviewError> {
            self.asked_access.lock().push(review);
            next(&self.access)
        }
    }

    fn status(code: u16, reason: &str) -> ReviewError {
        ReviewError::Api(kube::Error::Api(Box::new(
            kube::core::Status::failure("failed", reason).with_code(code),
        )))
    }

    fn authenticated(name: &str, extra: &[(&str, &str)]) -> TokenReview {
        use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo as Ui};
        TokenReview {
            status: Some(TokenReviewStatus {
                authenticated: Some(true),
                user: Some(Ui {
                    username: Some(name.into()),
                    uid: Some(format!("{name}-uid")),
                    groups: Some(vec!["ops".into()]),
                    extra: Some(
                        extra
                            .iter()
                            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn refused(error: Option<&str>) -> TokenReview {
        TokenReview {
            status: Some(k8s_openapi::api::authentication::v1::TokenReviewStatus {
                authenticated: Some(false),
                error: error.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn access(allowed: bool) -> SubjectAccessReview {
        SubjectAccessReview {
            status: Some(
                k8s_openapi::api::authorization::v1::SubjectAccessReviewStatus {
                    allowed,
                    ..Default::default()
                },
            ),
            ..Default::default()
        }
    }

    const WEBHOOKS: &str = "authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: true\n    cacheTTL: 2m\nauthorization:\n  mode: Webhook\n";

    fn scripted(script: Arc<Script>) -> Arc<Auth> {
        Auth::with_reviewer(&config(WEBHOOKS), "node-a", None, true, script).unwrap()
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled() {
        let api = Arc::new(OnceLock::new());
        let on = config("authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n");
        let a = Auth::new(&on, "n", None, false, api.clone()).unwrap();
        let mut none = HeaderMap::new();
        assert_eq!(
            a.authenticate(None, &mut none).await,
            Ok(UserInfo::anonymous())
        );
        // A bearer token with token webhooks off is not looked at.
        assert_eq!(
            a.authenticate(None, &mut bearer("tok")).await,
            Ok(UserInfo::anonymous())
        );
        // Webhook authentication whose client is not built yet fails
        // closed, without falling back to anonymous.
        let a = Auth::new(&config(WEBHOOKS), "n", None, true, api).unwrap();
        assert!(a.authenticate(None, &mut bearer("tok")).await.is_err());
        assert_eq!(
            a.authenticate(None, &mut none).await,
            Ok(UserInfo::anonymous())
        );
    }

    /// Upstream's bearertoken authenticator: scheme in any case, the token
    /// between the first and a second single space, empty is no token.
    #[test]
    fn bearer_tokens_are_read_as_upstream() {
        let read = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            bearer_token(&h)
        };
        assert_eq!(read("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(read("bEaReR abc").as_deref(), Some("abc"));
        assert_eq!(read("  Bearer abc  ").as_deref(), Some("abc"));
        assert_eq!(read("Bearer abc def").as_deref(), Some("abc"));
        assert_eq!(read("Bearer  abc"), None);
        assert_eq!(read("Bearer"), None);
        assert_eq!(read("Basic abc"), None);
    }

    /// Upstream's websocket protocol authenticator.
    #[test]
    fn websocket_subprotocol_tokens_as_upstream() {
        use base64::Engine;
        let enc = |t: &str| {
            format!(
                "{BEARER_PROTOCOL}{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t)
            )
        };
        let ws = |protocols: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::UPGRADE, "WebSocket".parse().unwrap());
            h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, protocols.parse().unwrap());
            h
        };
        let p = format!("{}, v5.channel.k8s.io, v4.channel.k8s.io", enc("tok?>"));
        assert_eq!(
            protocol_token(&ws(&p)),
            Ok(Some((
                "tok?>".into(),
                "v5.channel.k8s.io,v4.channel.k8s.io".into()
            )))
        );
        // Only on a WebSocket upgrade.
        let mut plain = ws(&p);
        plain.remove(header::UPGRADE);
        assert_eq!(protocol_token(&plain), Ok(None));
        assert_eq!(protocol_token(&ws("v5.channel.k8s.io")), Ok(None));
        let two = format!("{}, {}, v5.channel.k8s.io", enc("a"), enc("b"));
        assert_eq!(
            protocol_token(&ws(&two)),
            Err("multiple base64.bearer.authorization tokens specified".into())
        );
        assert_eq!(
            protocol_token(&ws(&enc("a"))),
            Err("missing additional subprotocol".into())
        );
        let padded = format!("{BEARER_PROTOCOL}YQ==, v5.channel.k8s.io");
        assert_eq!(
            protocol_token(&ws(&padded)),
            Err("invalid base64.bearer.authorization token encoding".into())
        );
        assert_eq!(
            protocol_token(&ws(&format!("{}, v5.channel.k8s.io", enc("")))),
            Ok(None)
        );
    }

    /// The token is reviewed (retried through a 500 and a 429, as
    /// upstream's webhook backoff), its Extra kept and sent on in the
    /// SubjectAccessReview; the answer is cached; the Authorization header
    /// is not passed on.
    #[tokio::test(start_paused = true)]
    async fn tokens_are_reviewed_with_retries_and_their_extra_authorized() {
        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![
            Err(status(500, "InternalError")),
            Err(status(429, "TooManyRequests")),
            Ok(authenticated(
                "carol",
                &[("authentication.kubernetes.io/pod-name", "p")],
            )),
        ];
        *script.access.lock() = vec![Err(status(504, "")), Ok(access(true))];
        let a = scripted(script.clone());
        let start = tokio::time::Instant::now();
        let mut h = bearer("carol-token");
        let user = a.authenticate(None, &mut h).await.expect("authenticated");
        assert_eq!(script.asked_tokens.lock().len(), 3);
        let waited = start.elapsed();
        // 0.5 s and 0.75 s, each up to 20 % more.
        assert!(
            waited >= Duration::from_millis(1250) && waited <= Duration::from_millis(1500),
            "{waited:?}"
        );
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert_eq!(user.name, "carol");
        assert_eq!(user.uid, "carol-uid");
        assert_eq!(user.groups, ["ops", "system:authenticated"]);
        assert_eq!(
            user.extra.get("authentication.kubernetes.io/pod-name"),
            Some(&vec!["p".to_string()])
        );
        assert_eq!(
            script.asked_tokens.lock()[0].spec.token.as_deref(),
            Some("carol-token")
        );
        // Cached: no fourth review.
        a.authenticate(None, &mut bearer("carol-token"))
            .await
            .unwrap();
        assert_eq!(script.asked_tokens.lock().len(), 3);
        let checks = request_attributes(&Method::GET, "/pods", true);
        assert_eq!(a.authorize(&user, &checks).await, Ok(true));
        let asked = script.asked_access.lock();
        assert_eq!(asked.len(), 2, "a 504 is retried");
        let spec = &asked[1].spec;
        assert_eq!(spec.user.as_deref(), Some("carol"));
        assert_eq!(spec.uid.as_deref(), Some("carol-uid"));
        assert_eq!(spec.extra.as_ref(), Some(&user.extra));
        let ra = spec.resource_attributes.as_ref().unwrap();
        assert_eq!(ra.subresource.as_deref(), Some("pods"));
        assert_eq!(ra.name.as_deref(), Some("node-a"));
    }

    /// A final error (403, a refused connection) is not retried nor
    /// cached; after five attempts a retried error is final too; a review
    /// naming an error is not cached; a plain "not authenticated" is. None
    /// falls back to anonymous, though it is enabled.
    #[tokio::test(start_paused = true)]
    async fn failed_reviews_are_retried_only_when_upstream_retries() {
        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![Err(status(403, "Forbidden"))];
        let a = scripted(script.clone());
        assert!(a.authenticate(None, &mut bearer("t")).await.is_err());
        assert_eq!(script.asked_tokens.lock().len(), 1);
        assert!(a.authenticate(None, &mut bearer("t")).await.is_err());
        assert_eq!(script.asked_tokens.lock().len(), 2, "errors are not cached");

        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![Err(status(500, ""))];
        let a = scripted(script.clone());
        assert!(a.authenticate(None, &mut bearer("t")).await.is_err());
        assert_eq!(script.asked_tokens.lock().len(), RETRY_ATTEMPTS as usize);

        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![Ok(refused(Some("token expired")))];
        let a = scripted(script.clone());
        assert_eq!(
            a.authenticate(None, &mut bearer("t")).await,
            Err("token expired".into())
        );
        a.authenticate(None, &mut bearer("t")).await.unwrap_err();
        assert_eq!(script.asked_tokens.lock().len(), 2);

        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![Ok(refused(None))];
        let a = scripted(script.clone());
        assert_eq!(
            a.authenticate(None, &mut bearer("t")).await,
            Err("invalid bearer token".into())
        );
        a.authenticate(None, &mut bearer("t")).await.unwrap_err();
        assert_eq!(script.asked_tokens.lock().len(), 1, "cached for cacheTTL");

        // An authorizer that keeps failing: five attempts, then a 500.
        *script.access.lock() = vec![Err(status(429, "TooManyRequests"))];
        let checks = request_attributes(&Method::GET, "/stats/summary", true);
        let user = UserInfo::anonymous();
        assert!(a.authorize(&user, &checks).await.is_err());
        assert_eq!(script.asked_access.lock().len(), RETRY_ATTEMPTS as usize);
    }

    /// The token a WebSocket client sends as a subprotocol authenticates
    /// it, and leaves the header with only the real protocols.
    #[tokio::test]
    async fn a_websocket_subprotocol_token_authenticates() {
        use base64::Engine;
        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![Ok(authenticated("dave", &[]))];
        let a = scripted(script.clone());
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("dave-token");
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            format!("v5.channel.k8s.io,{BEARER_PROTOCOL}{token}")
                .parse()
                .unwrap(),
        );
        let user = a.authenticate(None, &mut h).await.unwrap();
        assert_eq!(user.name, "dave");
        assert_eq!(h[header::SEC_WEBSOCKET_PROTOCOL], "v5.channel.k8s.io");
        assert_eq!(
            script.asked_tokens.lock()[0].spec.token.as_deref(),
            Some("dave-token")
        );
    }

    /// A CA and a client certificate signed by it with `dn`'s subject.
    fn client_cert(
        dn: &[(rcgen::DnType, &str)],
    ) -> (Vec<u8>, rustls::pki_types::CertificateDer<'static>) {
        use rcgen::{CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "ca");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p
            .signed_by(&key, &Issuer::from_params(&ca, &ca_key))
            .unwrap();
        (ca_cert.pem().into_bytes(), cert.der().clone())
    }

    fn user_of(a: Answer) -> UserInfo {
        match a {
            Answer::User(u) => u,
            other => panic!("not a user: {other:?}"),
        }
    }

    /// CommonNameUserConversion: the last CN, each O a group, the UID
    /// attribute, the credential ID; no CN is no opinion.
    #[test]
    fn certificate_users_as_upstream() {
        use rcgen::DnType;
        let uid = DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 57683, 2]);
        let (_, der) = client_cert(&[
            (DnType::CommonName, "first"),
            // The same OID again (rcgen keys its entries by type).
            (DnType::CustomDnType(vec![2, 5, 4, 3]), "alice"),
            (DnType::OrganizationName, "ops"),
            (uid.clone(), "alice-uid"),
        ]);
        let u = user_of(cert_user(der.as_ref(), true));
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["ops"]);
        assert_eq!(u.uid, "alice-uid");
        use sha2::Digest;
        let want: String = sha2::Sha256::digest(der.as_ref())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            u.extra[CREDENTIAL_ID],
            [format!("X509SHA256={want}")],
            "the credential ID"
        );
        assert_eq!(user_of(cert_user(der.as_ref(), false)).uid, "");
        let (_, der) = client_cert(&[(DnType::CommonName, "bob"), (uid, "")]);
        assert_eq!(
            cert_user(der.as_ref(), true),
            Answer::Failed("UID cannot be an empty string".into())
        );
        let (_, der) = client_cert(&[(DnType::OrganizationName, "ops")]);
        assert_eq!(cert_user(der.as_ref(), true), Answer::NoOpinion);
    }

    /// A certificate without a CN falls through to the token and to
    /// anonymous; one the CA does not verify fails, unless a token
    /// authenticates the request.
    #[tokio::test]
    async fn certificates_fall_through_as_upstream() {
        use rcgen::DnType;
        let (ca_pem, no_cn) = client_cert(&[(DnType::OrganizationName, "ops")]);
        let dir = crate::testutil::tempdir("auth");
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let provider = Arc::new(super::super::https::provider(&[], &[]).unwrap());
        let ca = super::super::https::ClientCa::load(ca_file, provider).unwrap();
        let script = Arc::new(Script::default());
        *script.tokens.lock() = vec![Ok(authenticated("carol", &[]))];
        let a =
            Auth::with_reviewer(&config(WEBHOOKS), "n", Some(ca), true, script.clone()).unwrap();
        let certs =
            |der: rustls::pki_types::CertificateDer<'static>| PeerCerts(Arc::new(vec![der]));
        let no_cn = certs(no_cn);
        assert_eq!(
            a.authenticate(Some(&no_cn), &mut HeaderMap::new()).await,
            Ok(UserInfo::anonymous())
        );
        assert_eq!(
            a.authenticate(Some(&no_cn), &mut bearer("t"))
                .await
                .unwrap()
                .name,
            "carol"
        );
        // Signed by another CA.
        let (_, stranger) = client_cert(&[(DnType::CommonName, "mallory")]);
        let stranger = certs(stranger);
        let e = a
            .authenticate(Some(&stranger), &mut HeaderMap::new())
            .await
            .unwrap_err();
        assert!(e.starts_with("verifying certificate failed"), "{e}");
        assert_eq!(
            a.authenticate(Some(&stranger), &mut bearer("t"))
                .await
                .unwrap()
                .name,
            "carol"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Upstream's group adder leaves users already grouped either way.
    #[test]
    fn the_authenticated_group_is_added_as_upstream() {
        let u = |name: &str, groups: &[&str]| UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(
            with_authenticated(u("a", &["x"])).groups,
            ["x", "system:authenticated"]
        );
        assert_eq!(
            with_authenticated(u("a", &["system:unauthenticated"])).groups,
            ["system:unauthenticated"]
        );
        assert!(with_authenticated(u("system:anonymous", &[]))
            .groups
            .is_empty());
    }
}
