//! A TEST DOUBLE of the Kubernetes API server, in process, for integration
//! tests. It is NOT a real API server: no etcd, no admission, no validation
//! beyond what is listed here, no RBAC beyond one rule, no conversion, and
//! objects are untyped JSON. It follows the real kube-apiserver's HTTP
//! semantics where a kubelet (kube-rs or client-go) observes them.
//!
//! The facade ([`ApiServer`]) is synchronous for plain `#[test]` functions;
//! it owns a two-thread tokio runtime and may also be called from inside
//! another runtime. [`Client`] is a small blocking HTTP/1.1 client for tests.
//!
//! Implemented:
//! - Resources: core v1 `pods` (+`/status`, `/ephemeralcontainers` and
//!   `/resize` as upstream's subresource strategies and validation, see
//!   ephemeral.rs and resize.rs; a plain pod write may not change container
//!   resources or resize policies), `nodes` (+`/status`),
//!   `namespaces` (default, kube-system, kube-node-lease, kube-public exist
//!   at start), `events`, `configmaps`, `secrets`, `services`,
//!   `serviceaccounts` (+`/token`), `persistentvolumes` (+`/status`),
//!   `persistentvolumeclaims` (+`/status`); `coordination.k8s.io/v1` `leases`;
//!   `events.k8s.io/v1` `events` (stored apart from core events; tests name
//!   it `events.events.k8s.io`); `certificates.k8s.io/v1`
//!   `certificatesigningrequests` (+`/status`, `/approval`);
//!   `certificates.k8s.io/v1beta1` `clustertrustbundles` (validation and
//!   the `spec.signerName` field selector of upstream's registry);
//!   `certificates.k8s.io/v1alpha1` `podcertificaterequests` (+`/status`;
//!   status cleared at create, the proof of possession verified for every
//!   key type upstream's validation takes (Ed25519, ECDSA P-256/P-384/P-521,
//!   RSA 3072/4096 with PSS), the `spec.nodeName`, `spec.podName`,
//!   `spec.signerName` and `metadata.name` field selectors, see podcert.rs);
//!   `storage.k8s.io/v1` `csidrivers` and `csinodes` (cluster-scoped,
//!   stored as given), `volumeattachments` (+`/status`; status cleared at
//!   create, `/status` writes keep spec and all of metadata).
//!   Discovery:
//!   `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}/{version}`.
//! - Server-set metadata: `uid`, `creationTimestamp`, `resourceVersion`
//!   (one global counter, decimal), `generation` (pods only: 1 at create, +1
//!   on spec change and when deletion starts). A write that changes nothing
//!   does not bump the resourceVersion and sends no event. Pods get
//!   `status.phase: Pending` and `spec.terminationGracePeriodSeconds: 30`
//!   (if unset) at create; CSRs get `spec.username`/`groups` of the creator;
//!   PVs get status phase Pending (+`lastPhaseTransitionTime`, kept or
//!   renewed on `/status` writes as upstream), reclaim policy Retain and
//!   volumeMode Filesystem; PVCs status phase Pending and volumeMode
//!   Filesystem.
//! - TokenRequest (`POST .../serviceaccounts/{name}/token`, 201, nothing
//!   stored): the ServiceAccount must exist; body name/namespace must match;
//!   `expirationSeconds` defaults to 3600 and must be 600..=2^32 (422);
//!   `boundObjectRef` Pod/Secret/Node must exist with the given uid (a pod
//!   must run as the ServiceAccount); empty audiences are the server's
//!   (`https://kubernetes.default.svc.cluster.local`);
//!   [`ApiServer::set_max_token_expiration`] caps the expiration (Warning
//!   header); pod-bound 3607 s tokens are extended to a year (`warnafter`).
//!   Tokens are JWT-shaped with upstream's claims but NOT signed; TokenReview
//!   authenticates them (expiry, audiences, ServiceAccount and bound object
//!   still there) as the service account. [`ApiServer::token_requests`]
//!   records the requests.
//! - [`ApiServer::publish_root_ca`]: the root CA publisher's
//!   `kube-root-ca.crt` ConfigMap for one namespace.
//! - ServiceAccount admission on pod creates, opt-in
//!   ([`ApiServerOptions::service_account_admission`]): default service
//!   account, 403 if it does not exist, the `kube-api-access-*` projected
//!   volume and mounts, image pull secrets, mirror pod rules.
//! - GET/list with `labelSelector` (`=`, `==`, `!=`, `key`, `!key`),
//!   `fieldSelector` (`=`, `==`, `!=`; the field labels each kind accepts,
//!   400 otherwise with upstream's message; CSRs and events.k8s.io events
//!   accept any dotted path), `limit` +
//!   `continue` (pages of the current state; a token older than the last
//!   compaction gets 410 Expired), `resourceVersionMatch=Exact` older than
//!   the last compaction gets 410; lists are otherwise always served from
//!   the current state, with `metadata.resourceVersion` = the current one.
//! - Watch (`watch=true|1`): from a resourceVersion (history replay), or
//!   from ""/"0" (synthetic ADDED of the current state), `sendInitialEvents`
//!   (+ the `k8s.io/initial-events-end` bookmark), `allowWatchBookmarks`
//!   (every [`ApiServerOptions::bookmark_interval`], default 1 s; upstream
//!   ~1 min), `timeoutSeconds`, label/field selectors with ADDED/DELETED when
//!   an object starts/stops matching (as the watch cache); a resourceVersion
//!   older than the last compaction gets one ERROR event (410 Expired, "too
//!   old resource version: X (Y)") and the end of the stream.
//! - POST (409 AlreadyExists, `generateName`, 400 if a resourceVersion is
//!   set), PUT (409 Conflict on a stale resourceVersion or another uid, 404
//!   if missing), `/status` writes keep the stored spec (and a pod's
//!   ownerReferences) but take status and metadata, as upstream's status
//!   strategies, and main-resource writes keep the stored status (kinds
//!   with a status subresource); a pod gets `status.qosClass` at create
//!   (ComputePodQOS, pod-level resources first, after defaultPodRequests)
//!   and a status write changing it is refused (422, immutable), PATCH
//!   as JSON merge patch (RFC 7386), strategic merge patch (merge keys of the
//!   fields the kubelet writes — pod status conditions, container statuses,
//!   podIPs/hostIPs; node status conditions/addresses; ownerReferences;
//!   finalizers as a set — plus `$patch`, `$setElementOrder`, `$retainKeys`,
//!   `$deleteFromPrimitiveList`; other lists are replaced) and JSON patch
//!   (RFC 6902); `metadata.uid`/`resourceVersion` in a patch are
//!   preconditions (409); server-side apply gets 415.
//! - DELETE with `DeleteOptions` or `?gracePeriodSeconds=` as upstream's
//!   rest.BeforeDelete and generic store: uid/resourceVersion preconditions
//!   (409); pods are deleted gracefully when bound and not terminal
//!   (deletionTimestamp = now + grace, deletionGracePeriodSeconds; MODIFIED;
//!   a later delete may only shorten it, counted from the first; a grace 0
//!   delete writes the object then deletes it: MODIFIED then DELETED, as
//!   upstream); objects with finalizers are marked deleting and go when the
//!   last finalizer is removed; pods answer with the object, other kinds
//!   with a Success Status once gone.
//! - Errors as `metav1.Status` with the upstream reasons and codes
//!   (NotFound, AlreadyExists, Conflict, Expired, BadRequest, Invalid,
//!   Unauthorized, Forbidden, UnsupportedMediaType, MethodNotAllowed).
//! - TLS with a cluster CA (serving certificate for 127.0.0.1/localhost);
//!   client certificates (CN = user, O = groups; verified against the CA);
//!   bootstrap tokens (`system:bootstrap:<id>` in `system:bootstrappers`,
//!   limited to CSRs like `system:node-bootstrapper`, 403 elsewhere, unless
//!   [`ApiServer::set_bootstrap_csr_only`] is turned off); 401 for unknown
//!   tokens and, with `require_client_cert`, for anonymous requests; other
//!   authenticated users may do anything. Plain HTTP with `tls: false`.
//! - CSRs: approval (test hook, auto-approval, or the `/approval`
//!   subresource: one write adding the Approved condition) then the signer
//!   (a second write setting `status.certificate`) for
//!   `kubernetes.io/kube-apiserver-client-kubelet`,
//!   `kubernetes.io/kube-apiserver-client` and `kubernetes.io/kubelet-serving`
//!   (SANs from the CSR): the CSR's subject and public key, key usages from
//!   `spec.usages`, lifetime [`ApiServer::set_issued_cert_lifetime`] capped by
//!   `spec.expirationSeconds`, backdated 5 min unless shorter than 8 h.
//!   Denied CSRs are not signed; other signers get a Failed condition.
//! - Faults: [`ApiServer::stop`]/[`ApiServer::restart`] (same port, same
//!   store; connections and watches are closed), [`ApiServer::partition`]
//!   (requests and new connections hang unanswered, open watches break
//!   without an ERROR event; when it heals the hung connections are closed
//!   unanswered, and new ones work), [`ApiServer::compact`].
//!
//! Not implemented: server-side apply, managedFields, protobuf, HTTP/2,
//! set-based label selectors (`in`, `notin`), consistent paginated
//! snapshots (pages come from the current state), lists at an old exact
//! resourceVersion (served from the current state unless compacted), a
//! resourceVersion newer than the current one (no wait, no 504), field
//! label checks for CSRs and events.k8s.io events, token signatures (no
//! keys; TokenReview works by lookup), bearer authentication of requests
//! with issued service account tokens, the TokenRequest uid precondition,
//! the admission plugin's wait for a missing `default` ServiceAccount and
//! its checks of volume plugins' secretRefs on mirror pods, validation and
//! defaulting
//! beyond the fields named above (e.g. pod spec immutability other than of
//! container resources and resize policies), namespace
//! lifecycle (objects may be created in any namespace), deletecollection,
//! garbage collection of owned objects, CSR signer policy checks (subjects,
//! usages), more than one O in [`ApiServer::issue_client_cert`] certificates
//! (rcgen writes one), real RBAC, the watch cache's random default timeout,
//! and the `$setElementOrder` interleaving of server-only list elements
//! (they are put after the ordered ones).

mod client;
mod ephemeral;
mod patch;
mod pki;
pub mod podcert;
mod resize;
mod server;
mod serviceaccount;
mod store;
pub mod trustbundle;

#[allow(unused_imports)]
pub use client::{Client, Response, WatchStream};
pub use store::ApiError;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use store::{DeleteOpts, Deleted, Sub};

/// How to start the double.
#[derive(Debug, Clone)]
pub struct ApiServerOptions {
    /// HTTPS with the double's CA (default); false: plain HTTP.
    pub tls: bool,
    /// The port to listen on; None: any free port.
    pub port: Option<u16>,
    /// Anonymous requests get 401 Unauthorized.
    pub require_client_cert: bool,
    /// Bootstrap tokens (`<id>.<secret>`) accepted as bearer tokens.
    pub bootstrap_tokens: Vec<String>,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK (the
    /// real server: about a minute).
    pub bookmark_interval: Duration,
    /// Run the ServiceAccount admission plugin on pod creates (default
    /// off: the double runs no admission unless asked). On: pods get
    /// `serviceAccountName: default` if unset, are rejected (403) if that
    /// ServiceAccount does not exist, and get the `kube-api-access-*`
    /// projected token volume and its mount unless automounting is off.
    pub service_account_admission: bool,
}

impl Default for ApiServerOptions {
    fn default() -> Self {
        ApiServerOptions {
            tls: true,
            port: None,
            require_client_cert: false,
            bootstrap_tokens: Vec::new(),
            bookmark_interval: Duration::from_secs(1),
            service_account_admission: false,
        }
    }
}

/// One HTTP request the double received.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    /// The response status; 0 if never answered (partition).
    pub status: u16,
    /// The authenticated user ("" if authentication failed).
    pub user: String,
    pub time: SystemTime,
}

/// The credentials a kubeconfig written by [`ApiServer::write_kubeconfig`]
/// holds.
#[derive(Debug, Clone)]
pub enum KubeconfigUser {
    ClientCert { cert: PathBuf, key: PathBuf },
    Token(String),
    Anonymous,
}

/// The API server double. Dropping it stops it.
pub struct ApiServer {
    rt: Option<tokio::runtime::Runtime>,
    shared: Arc<server::Shared>,
    port: u16,
    tls: bool,
    serving: Mutex<Option<(CancellationToken, TaskTracker)>>,
}

/// Binds 127.0.0.1:`port` for the runtime (without blocking on it, so
/// this works from inside other runtimes too).
fn bind(rt: &tokio::runtime::Runtime, port: u16) -> std::io::Result<TcpListener> {
    let l = std::net::TcpListener::bind(("127.0.0.1", port))?;
    l.set_nonblocking(true)?;
    let _guard = rt.enter();
    TcpListener::from_std(l)
}

fn resource(name: &str) -> &'static store::ResourceInfo {
    store::by_name(name)
}

impl ApiServer {
    /// Starts listening on 127.0.0.1 (`opts.port`, or any free port).
    pub fn start(opts: ApiServerOptions) -> ApiServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("apiserver-double")
            .enable_all()
            .build()
            .expect("tokio runtime");
        let listener = bind(&rt, opts.port.unwrap_or(0)).expect("bind the API server double");
        let port = listener.local_addr().expect("local addr").port();
        let pki = Arc::new(pki::Pki::new());
        let tls = opts
            .tls
            .then(|| tokio_rustls::TlsAcceptor::from(pki::server_config(&pki)));
        let (partition, _) = tokio::sync::watch::channel(false);
        let mut store = store::Store::new(pki);
        store.sa_admission = opts.service_account_admission;
        let shared = Arc::new(server::Shared {
            store: Mutex::new(store),
            tls,
            require_user: opts.require_client_cert,
            bootstrap_tokens: opts.bootstrap_tokens.clone(),
            bootstrap_csr_only: AtomicBool::new(true),
            bookmark_interval: opts.bookmark_interval,
            partition,
            requests: Mutex::new(Vec::new()),
            port,
            reviews: Mutex::new(server::Reviews::default()),
        });
        let s = ApiServer {
            rt: Some(rt),
            shared,
            port,
            tls: opts.tls,
            serving: Mutex::new(None),
        };
        s.serve(listener);
        s
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime")
    }

    /// Runs `f` on the double's runtime and waits for it, also when called
    /// from inside another tokio runtime (then from a helper thread).
    fn block_on<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.rt().block_on(f);
        }
        let handle = self.rt().handle().clone();
        std::thread::scope(|scope| {
            scope
                .spawn(move || handle.block_on(f))
                .join()
                .expect("API server double helper thread")
        })
    }

    fn serve(&self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        self.rt().spawn(server::serve(
            self.shared.clone(),
            listener,
            stop.clone(),
            tracker.clone(),
        ));
        *self.serving.lock() = Some((stop, tracker));
    }

    /// `https://127.0.0.1:PORT` (or `http://`).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Closes the listener and every connection (open watches end); the
    /// store stays. Returns once all connections are closed.
    pub fn stop(&self) {
        let Some((stop, tracker)) = self.serving.lock().take() else {
            return;
        };
        stop.cancel();
        tracker.close();
        self.block_on(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
            // Let the accept task drop the listener.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        });
    }

    /// Listens again on the same port, with the same store.
    pub fn restart(&self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match bind(self.rt(), self.port) {
                Ok(l) => break l,
                Err(e) if Instant::now() > deadline => panic!("rebind port {}: {e}", self.port),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        self.serve(listener);
    }

    /// While on, connections are accepted but never answered, requests
    /// hang, and open watches break (the connection drops, no ERROR event, no
    /// clean end of the stream). When it heals, the connections that hung
    /// are closed unanswered (so a write sent during the partition is never
    /// applied) and new connections are served.
    pub fn partition(&self, on: bool) {
        self.shared.partition.send_replace(on);
    }

    /// Forgets the watch history up to now: watches (and `Exact` lists or
    /// continue tokens) from an older resourceVersion get 410 Expired.
    pub fn compact(&self) {
        self.shared.store.lock().compact();
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().resource_version()
    }

    /// Creates an object (resource from apiVersion/kind, namespace from
    /// metadata.namespace, "default" if unset for namespaced kinds).
    /// Panics on errors; see [`ApiServer::try_create`].
    pub fn create(&self, obj: Value) -> Value {
        self.try_create(obj).expect("create")
    }

    pub fn try_create(&self, obj: Value) -> Result<Value, ApiError> {
        let res = store::by_kind(
            obj["apiVersion"].as_str().unwrap_or(""),
            obj["kind"].as_str().unwrap_or(""),
        )
        .ok_or_else(|| ApiError::bad_request("unknown apiVersion/kind"))?;
        let ns = if res.namespaced {
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        self.shared.store.lock().create(res, &ns, obj, None)
    }

    pub fn get(&self, resource: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        self.shared
            .store
            .lock()
            .get(self::resource(resource), ns.unwrap_or(""), name)
    }

    /// Every object of a resource, all namespaces.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        self.shared
            .store
            .lock()
            .list(self::resource(resource), None, &Default::default())
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// Replaces an object (as PUT; status is kept for kinds with a status
    /// subresource, use [`ApiServer::update_status`]). Panics on errors.
    pub fn update(&self, obj: Value) -> Value {
        self.write(obj, Sub::Main).expect("update")
    }

    /// Replaces an object's status (as PUT on `/status`). Panics on errors.
    pub fn update_status(&self, obj: Value) -> Value {
        self.write(obj, Sub::Status).expect("update status")
    }

    pub fn try_update(&self, obj: Value) -> Result<Value, ApiError> {
        self.write(obj, Sub::Main)
    }

    fn write(&self, obj: Value, sub: Sub) -> Result<Value, ApiError> {
        let res = store::by_kind(
            obj["apiVersion"].as_str().unwrap_or(""),
            obj["kind"].as_str().unwrap_or(""),
        )
        .ok_or_else(|| ApiError::bad_request("unknown apiVersion/kind"))?;
        let ns = if res.namespaced {
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.shared.store.lock().update(res, &ns, &name, obj, sub)
    }

    /// Deletes as DELETE with `gracePeriodSeconds` = `grace` (pods may stay,
    /// being deleted gracefully). Returns the object's state after the
    /// delete (None if it was not there or is gone).
    pub fn delete(
        &self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
        grace: Option<i64>,
    ) -> Option<Value> {
        let opts = DeleteOpts {
            grace,
            ..Default::default()
        };
        match self.shared.store.lock().delete(
            self::resource(resource),
            ns.unwrap_or(""),
            name,
            &opts,
        ) {
            Ok(Deleted::Pending(v)) => Some(v),
            _ => None,
        }
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests.lock().clone()
    }

    /// Requests whose method is `method` and whose path+query contains
    /// `path_part`.
    pub fn count_requests(&self, method: &str, path_part: &str) -> usize {
        self.shared
            .requests
            .lock()
            .iter()
            .filter(|r| r.method == method && r.path.contains(path_part))
            .count()
    }

    /// Polls an object every 50 ms until `f` holds for it (None: absent) and
    /// returns it; panics after `timeout`.
    pub fn wait_for(
        &self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
        timeout: Duration,
        f: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let obj = self.get(resource, ns, name);
            if f(obj.as_ref()) {
                return obj;
            }
            if Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for {resource} {ns:?}/{name}: last {obj:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // --- PKI ---

    /// The cluster CA, PEM.
    pub fn ca_pem(&self) -> String {
        self.shared.store.lock().pki.ca_pem().to_string()
    }

    /// A client certificate (CN = user, O = group; only the first of `orgs`)
    /// and key signed by the CA, PEM.
    pub fn issue_client_cert(&self, cn: &str, orgs: &[&str], valid: Duration) -> (String, String) {
        let pki = self.shared.store.lock().pki.clone();
        pki.client_cert(cn, orgs, valid)
    }

    /// Writes a kubeconfig for this server (CA inline) and `user`.
    pub fn write_kubeconfig(&self, path: &Path, user: KubeconfigUser) {
        let b64 = |s: &str| {
            serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec()))
                .expect("base64")
                .as_str()
                .expect("string")
                .to_string()
        };
        let mut cluster = format!("    server: {}\n", self.url());
        if self.tls {
            cluster.push_str(&format!(
                "    certificate-authority-data: {}\n",
                b64(&self.ca_pem())
            ));
        }
        let user = match user {
            KubeconfigUser::ClientCert { cert, key } => format!(
                "    client-certificate: {}\n    client-key: {}\n",
                cert.display(),
                key.display()
            ),
            KubeconfigUser::Token(t) => format!("    token: {t}\n"),
            KubeconfigUser::Anonymous => "    {}\n".to_string(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n{cluster}users:\n- name: user\n  user:\n{user}contexts:\n- name: double\n  context:\n    cluster: double\n    user: user\ncurrent-context: double\n"
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// Approve every new CSR at once (as the csrapproving controller does
    /// for kubelet client CSRs).
    pub fn set_csr_auto_approve(&self, on: bool) {
        self.shared.store.lock().csr.auto_approve = on;
    }

    /// Approves a CSR (Approved condition, then the signer issues).
    pub fn approve_csr(&self, name: &str) {
        let ok = self
            .shared
            .store
            .lock()
            .approve_csr(name, "TestApproved", "approved by the test");
        assert!(ok, "no CSR {name}");
    }

    /// The lifetime of certificates the CSR signer issues (capped by a CSR's
    /// `spec.expirationSeconds`). Default one year.
    pub fn set_issued_cert_lifetime(&self, d: Duration) {
        self.shared.store.lock().csr.lifetime = d;
    }

    /// Whether bootstrap-token users may only use CSRs (default true, as the
    /// real `system:node-bootstrapper` role).
    pub fn set_bootstrap_csr_only(&self, on: bool) {
        self.shared.bootstrap_csr_only.store(on, Ordering::Relaxed);
    }

    /// TokenReview answers `token` as authenticated for `user` in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.shared.reviews.lock().tokens.insert(
            token.into(),
            (
                user.into(),
                format!("uid-{user}"),
                groups.iter().map(|g| g.to_string()).collect(),
            ),
        );
    }

    /// Caps the expiration of issued service account tokens, as
    /// `--service-account-max-token-expiration`: a TokenRequest asking for
    /// more gets this much (`spec.expirationSeconds` and
    /// `status.expirationTimestamp` say so, with a Warning header). Whole
    /// seconds, at least 1; upstream's flag must be at least 1 h, the
    /// double takes any value so that tests can see short-lived tokens.
    pub fn set_max_token_expiration(&self, d: Duration) {
        self.shared.store.lock().tokens.max_expiration = Some(serviceaccount::secs(d));
    }

    /// Every TokenRequest so far: (namespace, service account, `spec` as
    /// sent), failed ones included.
    pub fn token_requests(&self) -> Vec<(String, String, Value)> {
        self.shared.store.lock().tokens.requests.clone()
    }

    /// The root CA publisher for one namespace: creates (or brings back)
    /// the ConfigMap `kube-root-ca.crt` with `ca.crt` = the double's CA
    /// PEM. Returns it.
    pub fn publish_root_ca(&self, ns: &str) -> Value {
        serviceaccount::publish_root_ca(&mut self.shared.store.lock(), ns)
            .expect("publish kube-root-ca.crt")
    }

    /// SubjectAccessReview allows `user` to `verb` `resource`/`subresource`
    /// ("*" matches anything); everything else is denied.
    pub fn allow(&self, user: &str, verb: &str, resource: &str, subresource: &str) {
        self.shared.reviews.lock().allow.push([
            user.into(),
            verb.into(),
            resource.into(),
            subresource.into(),
        ]);
    }

    /// A kubeconfig in `dir` with a client certificate for
    /// `system:node:<node>` (group `system:nodes`), as a bootstrapped
    /// kubelet has; returns its path.
    pub fn node_kubeconfig(&self, dir: &Path, node: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let (cert, key) = self.issue_client_cert(
            &format!("system:node:{node}"),
            &["system:nodes"],
            Duration::from_secs(3600),
        );
        let (c, k) = (dir.join("client.crt"), dir.join("client.key"));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        let path = dir.join("kubelet.conf");
        self.write_kubeconfig(&path, KubeconfigUser::ClientCert { cert: c, key: k });
        path
    }

    /// A test client for this server (anonymous; see [`Client`]).
    pub fn client(&self) -> Client {
        Client::new(self)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some((stop, _)) = self.serving.lock().take() {
            stop.cancel();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
