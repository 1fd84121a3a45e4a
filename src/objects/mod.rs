//! The API objects pods read (upstream `pkg/kubelet/configmap`, `secret`,
//! `token`): ConfigMaps and Secrets referenced by this node's pods, service
//! account tokens through TokenRequest, Services for service-link env
//! vars, PVCs and PVs for volumes. Static pods have no API server behind
//! them: every getter answers `NoApiServer` until cluster mode fills the
//! client slot.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use kube::api::PostParams;
use kube::Api;

use crate::apiclient::ApiClient;

pub mod podcert;
pub mod trustbundle;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ObjectError {
    /// Upstream's `apierrors.NewNotFound(v1.Resource(kind), name)`:
    /// `configmap "x" not found`, `secret "x" not found`.
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("no API server: {kind} {name:?} can't be fetched")]
    NoApiServer { kind: &'static str, name: String },
    #[error("{kind} {name:?}: {message}")]
    Api {
        kind: &'static str,
        name: String,
        message: String,
    },
}

impl ObjectError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ObjectError::NotFound { .. })
    }
}

/// A service-account token as TokenRequest returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub token: String,
    /// Unix seconds of `status.expirationTimestamp`.
    pub expires_at: i64,
    /// Unix seconds after which the manager fetches a fresh token (80 % of
    /// its life, at most 24 h after issue): a volume holding it should be
    /// rewritten then.
    pub refresh_at: i64,
}

/// A change to an object the manager watches, for remounting volumes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// "configmap", "secret", "clustertrustbundle" (cluster-scoped: an
    /// empty namespace) or "podcertificaterequest" (a request a pod's
    /// source waits on reached a terminal state; `name` is the pod's UID).
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

/// configMapAndSecretChangeDetectionStrategy: how ConfigMaps and Secrets
/// are read (upstream's Watch, Cache and Get managers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChangeDetection {
    /// One watch per referenced object, served from it.
    #[default]
    Watch,
    /// A GET per object, kept for the Node's `node.alpha.kubernetes.io/ttl`
    /// (1 min without it) and fetched again when a pod referencing it is
    /// (re)registered.
    Cache,
    /// A GET on every read.
    Get,
}

impl ChangeDetection {
    /// The config value (validation accepts only these three).
    pub fn parse(s: &str) -> Self {
        match s {
            "Cache" => ChangeDetection::Cache,
            "Get" => ChangeDetection::Get,
            _ => ChangeDetection::Watch,
        }
    }
}

/// Upstream's v1.ObjectTTLAnnotationKey, set on Nodes by the TTL controller.
pub const OBJECT_TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";
/// The Cache strategy's defaultTTL.
const DEFAULT_TTL: Duration = Duration::from_secs(60);

type TtlSource = Box<dyn Fn() -> Option<Duration> + Send + Sync>;

/// The handle every part that reads pod data holds; cheap to clone.
#[derive(Clone, Default)]
pub struct ObjectManager {
    api: Arc<OnceLock<ApiClient>>,
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changes: OnceLock<broadcast::Sender<ObjectKey>>,
    /// Where reflector tasks are tracked and cancelled (set by `new`).
    tasks: OnceLock<(TaskTracker, CancellationToken)>,
    /// Every Service by (namespace, name); None until the first list.
    services: OnceLock<watch::Receiver<Option<Arc<ServiceMap>>>>,
    /// The change-detection strategy and the pod resync period (how often
    /// volumes read from API data are written again when no watch says
    /// what changed).
    strategy: OnceLock<(ChangeDetection, Duration)>,
    /// The Cache strategy's TTL, from the Node (cluster mode).
    ttl: OnceLock<TtlSource>,
    /// ClusterTrustBundles: the feature gate and the lazily started watch.
    trust_bundles: trustbundle::TrustBundles,
    /// podCertificate projections: the feature gate and each source's state.
    pod_certs: podcert::PodCerts,
}

type ServiceMap = std::collections::BTreeMap<(String, String), Arc<Service>>;

#[derive(Default)]
struct State {
    config_maps: HashMap<(String, String), Item<ConfigMap>>,
    secrets: HashMap<(String, String), Item<Secret>>,
    /// What each registered pod references: (namespace, configmaps, secrets).
    pods: HashMap<String, PodRefs>,
    tokens: HashMap<String, (Token, Option<String>)>,
}

#[derive(Default, Clone)]
struct PodRefs {
    namespace: String,
    config_maps: BTreeSet<String>,
    secrets: BTreeSet<String>,
}

/// What a watched object's cache holds.
#[derive(Clone)]
enum Slot<K> {
    /// The first list has not answered yet.
    Unsynced,
    /// The object as the watch last saw it; None when it does not exist.
    Synced(Option<Arc<K>>),
}

/// One object followed for as long as a pod references it.
struct Item<K> {
    refs: usize,
    source: Source<K>,
}

enum Source<K> {
    Watch {
        slot: watch::Receiver<Slot<K>>,
        cancel: CancellationToken,
    },
    Cache(Arc<Mutex<Cached<K>>>),
}

/// The Cache strategy's entry (upstream's objectData).
struct Cached<K> {
    /// The object, or NotFound, as last fetched; None: fetch on next read.
    last: Option<Result<Arc<K>, ObjectError>>,
    fetched: tokio::time::Instant,
}

impl<K> Default for Cached<K> {
    fn default() -> Self {
        Cached {
            last: None,
            fetched: tokio::time::Instant::now(),
        }
    }
}

fn api_err(kind: &'static str, name: &str, e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ObjectError::NotFound {
            kind,
            name: name.to_string(),
        },
        other => ObjectError::Api {
            kind,
            name: name.to_string(),
            message: other.to_string(),
        },
    }
}

/// How long a getter waits for a newly started watch's first list
/// (upstream's watch-based manager polls for one second).
const SYNC_WAIT: Duration = Duration::from_secs(1);

/// A kind the manager watches per object.
trait Watched:
    kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    fn items(state: &mut State) -> &mut HashMap<(String, String), Item<Self>>;
}

impl Watched for ConfigMap {
    const KIND: &'static str = "configmap";
    fn items(state: &mut State) -> &mut HashMap<(String, String), Item<Self>> {
        &mut state.config_maps
    }
}

impl Watched for Secret {
    const KIND: &'static str = "secret";
    fn items(state: &mut State) -> &mut HashMap<(String, String), Item<Self>> {
        &mut state.secrets
    }
}

impl ObjectManager {
    /// `tasks` and `token` own the per-object watch tasks: cancelled and
    /// awaited with the rest at shutdown.
    pub fn new(
        api: Arc<OnceLock<ApiClient>>,
        tasks: TaskTracker,
        token: CancellationToken,
    ) -> Self {
        let inner = Inner::default();
        let _ = inner.tasks.set((tasks, token));
        let _ = inner.changes.set(broadcast::channel(256).0);
        ObjectManager {
            api,
            inner: Arc::new(inner),
        }
    }

    fn client(&self, kind: &'static str, name: &str) -> Result<&ApiClient, ObjectError> {
        self.api.get().ok_or_else(|| ObjectError::NoApiServer {
            kind,
            name: name.to_string(),
        })
    }

    /// Starts watching what the pod references (upstream's RegisterPod):
    /// one watch per object, shared by every pod that references it. The
    /// references of an earlier version of the pod are released after the
    /// new ones are taken, so an object both reference keeps its watch.
    pub fn register_pod(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let refs = pod_refs(pod);
        let mut st = self.inner.state.lock();
        for name in &refs.config_maps {
            self.add_ref::<ConfigMap>(&mut st, &refs.namespace, name);
        }
        for name in &refs.secrets {
            self.add_ref::<Secret>(&mut st, &refs.namespace, name);
        }
        if let Some(old) = st.pods.insert(uid, refs) {
            self.release(&mut st, &old);
        }
        drop(st);
        self.track_pod_certificates(pod);
    }

    /// Stops watching what only this pod referenced (UnregisterPod) and
    /// forgets the tokens bound to it.
    pub fn unregister_pod(&self, uid: &str) {
        let mut st = self.inner.state.lock();
        if let Some(old) = st.pods.remove(uid) {
            self.release(&mut st, &old);
        }
        st.tokens
            .retain(|_, (_, bound)| bound.as_deref() != Some(uid));
        drop(st);
        self.forget_pod_certificates(uid);
    }

    /// Objects watched now: (configmaps, secrets).
    pub fn watched(&self) -> (usize, usize) {
        let st = self.inner.state.lock();
        (st.config_maps.len(), st.secrets.len())
    }

    fn release(&self, st: &mut State, refs: &PodRefs) {
        for name in &refs.config_maps {
            Self::drop_ref::<ConfigMap>(st, &refs.namespace, name);
        }
        for name in &refs.secrets {
            Self::drop_ref::<Secret>(st, &refs.namespace, name);
        }
    }

    fn drop_ref<K: Watched>(st: &mut State, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        let items = K::items(st);
        if let Some(item) = items.get_mut(&key) {
            item.refs -= 1;
            if item.refs == 0 {
                if let Source::Watch { cancel, .. } = &item.source {
                    cancel.cancel();
                }
                items.remove(&key);
            }
        }
    }

    fn add_ref<K: Watched>(&self, st: &mut State, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        if let Some(item) = K::items(st).get_mut(&key) {
            item.refs += 1;
            // Upstream's AddReference: a (re)registered pod reads the
            // object afresh.
            if let Source::Cache(c) = &item.source {
                *c.lock() = Cached::default();
            }
            return;
        }
        match self.strategy().0 {
            // Every read is a GET: nothing to keep.
            ChangeDetection::Get => return,
            ChangeDetection::Cache => {
                K::items(st).insert(
                    key,
                    Item {
                        refs: 1,
                        source: Source::Cache(Default::default()),
                    },
                );
                return;
            }
            ChangeDetection::Watch => {}
        }
        // Without a runtime of tasks (unit tests) or an API client (static
        // pods) there is nothing to watch: getters fall back to a GET.
        let (Some((tasks, token)), Some(api)) = (self.inner.tasks.get(), self.api.get()) else {
            return;
        };
        let (tx, rx) = watch::channel(Slot::Unsynced);
        let cancel = token.child_token();
        let object = ObjectKey {
            kind: K::KIND,
            namespace: ns.to_string(),
            name: name.to_string(),
        };
        let changes = self.inner.changes.get().cloned();
        let (api, c) = (api.clone(), cancel.clone());
        let span =
            tracing::debug_span!("object-watch", kind = K::KIND, namespace = %ns, name = %name);
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                tokio::select! {
                    _ = c.cancelled() => {}
                    _ = reflect::<K>(api, object, tx, changes) => {}
                }
            },
            span,
        ));
        K::items(st).insert(
            key,
            Item {
                refs: 1,
                source: Source::Watch { slot: rx, cancel },
            },
        );
    }

    /// From the object's watch when a pod references it, else one GET.
    async fn get<K: Watched>(&self, ns: &str, name: &str) -> Result<Arc<K>, ObjectError> {
        let source = {
            let mut st = self.inner.state.lock();
            K::items(&mut st)
                .get(&(ns.to_string(), name.to_string()))
                .map(|i| match &i.source {
                    Source::Watch { slot, .. } => Ok(slot.clone()),
                    Source::Cache(c) => Err(c.clone()),
                })
        };
        let not_found = || ObjectError::NotFound {
            kind: K::KIND,
            name: name.to_string(),
        };
        let slot = match source {
            Some(Err(cached)) => return self.get_cached(&cached, ns, name).await,
            Some(Ok(slot)) => Some(slot),
            None => None,
        };
        if let Some(mut slot) = slot {
            let synced =
                tokio::time::timeout(SYNC_WAIT, slot.wait_for(|s| matches!(s, Slot::Synced(_))))
                    .await;
            return match synced {
                Ok(Ok(s)) => match &*s {
                    Slot::Synced(Some(o)) => Ok(o.clone()),
                    _ => Err(not_found()),
                },
                // Upstream's words for a watch that has not listed yet.
                _ => Err(ObjectError::Api {
                    kind: K::KIND,
                    name: name.to_string(),
                    message: format!(
                        "failed to sync {} cache: timed out waiting for the condition",
                        K::KIND
                    ),
                }),
            };
        }
        let api: Api<K> = Api::namespaced(self.client(K::KIND, name)?.client().await, ns);
        api.get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err(K::KIND, name, e))
    }

    /// Upstream's objectStore.Get: the cached object while younger than
    /// the TTL, else a GET (from the API server's cache when refreshing an
    /// object fetched before); a failed refresh keeps serving what was
    /// fetched, and an older answer never replaces a newer one.
    async fn get_cached<K: Watched>(
        &self,
        cached: &Mutex<Cached<K>>,
        ns: &str,
        name: &str,
    ) -> Result<Arc<K>, ObjectError> {
        let ttl = self
            .inner
            .ttl
            .get()
            .and_then(|f| f())
            .unwrap_or(DEFAULT_TTL);
        let had = {
            let c = cached.lock();
            match &c.last {
                Some(r) if c.fetched.elapsed() < ttl => return r.clone(),
                last => last.clone(),
            }
        };
        let api: Api<K> = Api::namespaced(self.client(K::KIND, name)?.client().await, ns);
        let got = match &had {
            Some(Ok(_)) => api.get_with(name, &kube::api::GetParams::any()).await,
            _ => api.get(name).await,
        }
        .map_err(|e| api_err(K::KIND, name, e));
        let mut c = cached.lock();
        let rv = |o: &K| {
            o.meta()
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        };
        match got {
            Err(e) if !e.is_not_found() => {
                return match &c.last {
                    Some(last) => last.clone(),
                    None => Err(e),
                }
            }
            Ok(o) if matches!(&c.last, Some(Ok(old)) if rv(&o) < rv(old)) => {}
            r => {
                c.last = Some(r.map(Arc::new));
                c.fetched = tokio::time::Instant::now();
            }
        }
        c.last.clone().expect("set above")
    }

    /// The strategy, and the resync period when volumes must be written
    /// again periodically (no watch tells what changed).
    pub fn strategy(&self) -> (ChangeDetection, Duration) {
        self.inner
            .strategy
            .get()
            .copied()
            .unwrap_or((ChangeDetection::Watch, Duration::from_secs(60)))
    }

    /// Sets configMapAndSecretChangeDetectionStrategy (before pods come).
    pub fn with_strategy(self, s: ChangeDetection, resync: Duration) -> Self {
        let _ = self.inner.strategy.set((s, resync));
        self
    }

    /// Where the Cache strategy reads its TTL (the Node's annotation).
    pub fn set_ttl_source(&self, f: TtlSource) {
        let _ = self.inner.ttl.set(f);
    }

    pub async fn config_map(&self, ns: &str, name: &str) -> Result<Arc<ConfigMap>, ObjectError> {
        self.get::<ConfigMap>(ns, name).await
    }

    pub async fn secret(&self, ns: &str, name: &str) -> Result<Arc<Secret>, ObjectError> {
        self.get::<Secret>(ns, name).await
    }

    /// A token for `serviceaccounts/<sa>/token` in `ns`; `spec` carries the
    /// audiences, expirationSeconds and the bound pod reference.
    pub async fn service_account_token(
        &self,
        ns: &str,
        sa: &str,
        spec: TokenRequestSpec,
    ) -> Result<Token, ObjectError> {
        self.token_for(ns, sa, None, spec).await
    }

    /// As [`Self::service_account_token`], with the ServiceAccount's UID as
    /// the TokenRequest's `metadata.uid`: the API server refuses the request
    /// if the account was recreated meanwhile (upstream's credential
    /// provider sets it so).
    pub async fn service_account_token_for_uid(
        &self,
        ns: &str,
        sa: &str,
        sa_uid: &str,
        spec: TokenRequestSpec,
    ) -> Result<Token, ObjectError> {
        let uid = Some(sa_uid.to_string()).filter(|u| !u.is_empty());
        self.token_for(ns, sa, uid, spec).await
    }

    async fn token_for(
        &self,
        ns: &str,
        sa: &str,
        sa_uid: Option<String>,
        spec: TokenRequestSpec,
    ) -> Result<Token, ObjectError> {
        let now = crate::kuberuntime::wall_now().as_secs() as i64;
        let bound = spec.bound_object_ref.as_ref().and_then(|r| r.uid.clone());
        let key = format!(
            "{ns}/{sa}/{sa_uid:?}/{:?}/{:?}/{:?}",
            spec.audiences, spec.expiration_seconds, bound
        );
        let cached = self
            .inner
            .state
            .lock()
            .tokens
            .get(&key)
            .map(|t| t.0.clone());
        if let Some(t) = &cached {
            if now < t.refresh_at {
                return Ok(t.clone());
            }
        }
        match self.request_token(ns, sa, sa_uid, spec, now).await {
            Ok(t) => {
                let mut st = self.inner.state.lock();
                st.tokens.retain(|_, (t, _)| t.expires_at > now);
                st.tokens.insert(key, (t.clone(), bound));
                Ok(t)
            }
            // A token that still works is better than none (upstream's
            // token manager serves it and logs).
            Err(e) => match cached.filter(|t| t.expires_at > now) {
                Some(t) => {
                    warn!(namespace = %ns, serviceaccount = %sa, error = %e, "couldn't refresh a service account token; the current one stays until it expires");
                    Ok(t)
                }
                None => Err(e),
            },
        }
    }

    async fn request_token(
        &self,
        ns: &str,
        sa: &str,
        sa_uid: Option<String>,
        spec: TokenRequestSpec,
        now: i64,
    ) -> Result<Token, ObjectError> {
        let c = self.client("serviceaccount", sa)?.client().await;
        let api: Api<ServiceAccount> = Api::namespaced(c, ns);
        let mut req = TokenRequest {
            spec,
            ..Default::default()
        };
        req.metadata.uid = sa_uid;
        let tr = api
            .create_token_request(sa, &PostParams::default(), &req)
            .await
            .map_err(|e| api_err("serviceaccount", sa, e))?;
        let status = tr.status.ok_or_else(|| ObjectError::Api {
            kind: "serviceaccount",
            name: sa.to_string(),
            message: "TokenRequest answered without a status".into(),
        })?;
        let expires_at = status.expiration_timestamp.0.as_second();
        Ok(Token {
            token: status.token,
            expires_at,
            refresh_at: token_refresh_at(now, expires_at),
        })
    }

    /// A ServiceAccount, read with a GET each time (upstream's credential
    /// provider plugins read the pod's account so, through the kubelet's
    /// client; the node authorizer allows it for accounts of pods bound to
    /// the node).
    pub async fn service_account(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Arc<ServiceAccount>, ObjectError> {
        let c = self.client("serviceaccount", name)?.client().await;
        Api::<ServiceAccount>::namespaced(c, ns)
            .get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("serviceaccount", name, e))
    }

    /// Services for service-link env vars: those of `ns` and of `default`,
    /// from a cluster-wide watch of Services started on first use (upstream's
    /// service informer; the node authorizer allows it). Until its first list
    /// answers, upstream's error.
    pub async fn services(&self, ns: &str) -> Result<Vec<Arc<Service>>, ObjectError> {
        self.client("service", ns)?;
        let mut rx = self.services_watch();
        let synced = tokio::time::timeout(SYNC_WAIT, rx.wait_for(|s| s.is_some())).await;
        let all =
            match synced {
                Ok(Ok(s)) => s.clone().unwrap_or_default(),
                _ => return Err(ObjectError::Api {
                    kind: "service",
                    name: ns.to_string(),
                    message:
                        "services have not yet been read at least once, cannot construct envvars"
                            .into(),
                }),
            };
        Ok(all
            .iter()
            .filter(|((n, _), _)| n == ns || n == "default")
            .map(|(_, s)| s.clone())
            .collect())
    }

    fn services_watch(&self) -> watch::Receiver<Option<Arc<ServiceMap>>> {
        self.inner
            .services
            .get_or_init(|| {
                let (tx, rx) = watch::channel(None);
                if let (Some((tasks, token)), Some(api)) = (self.inner.tasks.get(), self.api.get())
                {
                    let (api, token) = (api.clone(), token.clone());
                    tasks.spawn(tracing::Instrument::instrument(
                        async move {
                            tokio::select! {
                                _ = token.cancelled() => {}
                                _ = reflect_services(api, tx) => {}
                            }
                        },
                        tracing::info_span!("service-watch"),
                    ));
                }
                rx
            })
            .clone()
    }

    pub async fn persistent_volume_claim(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Arc<PersistentVolumeClaim>, ObjectError> {
        let c = self.client("persistentvolumeclaim", name)?.client().await;
        Api::<PersistentVolumeClaim>::namespaced(c, ns)
            .get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("persistentvolumeclaim", name, e))
    }

    pub async fn persistent_volume(
        &self,
        name: &str,
    ) -> Result<Arc<PersistentVolume>, ObjectError> {
        let c = self.client("persistentvolume", name)?.client().await;
        Api::<PersistentVolume>::all(c)
            .get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("persistentvolume", name, e))
    }

    /// Changes to watched ConfigMaps and Secrets.
    pub fn subscribe(&self) -> broadcast::Receiver<ObjectKey> {
        match self.inner.changes.get() {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }
}

/// Follows one object with a `metadata.name` field selector (upstream's
/// watch-based change detection): list, then watch, re-list on 410 Gone,
/// retry with backoff. A lost API server keeps the last state served.
async fn reflect<K: Watched>(
    api: ApiClient,
    key: ObjectKey,
    tx: watch::Sender<Slot<K>>,
    changes: Option<broadcast::Sender<ObjectKey>>,
) {
    let mut generation = api.generation();
    loop {
        generation.borrow_and_update();
        let objects: Api<K> = Api::namespaced(api.client().await, &key.namespace);
        let cfg = watcher::Config::default()
            .fields(&format!("metadata.name={}", key.name))
            .timeout(290);
        let mut stream = watcher(objects, cfg).default_backoff().boxed();
        let follow = async {
            let mut listed: Option<Option<K>> = None;
            while let Some(ev) = stream.next().await {
                let now = match ev {
                    Ok(watcher::Event::Init) => {
                        listed = Some(None);
                        continue;
                    }
                    Ok(watcher::Event::InitApply(o)) => {
                        listed = Some(Some(o));
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => listed.take().flatten(),
                    Ok(watcher::Event::Apply(o)) => Some(o),
                    Ok(watcher::Event::Delete(_)) => None,
                    Err(e) => {
                        warn!(kind = key.kind, namespace = %key.namespace, name = %key.name, error = %e, "watch failed; retrying with backoff");
                        continue;
                    }
                };
                let rv = |s: &Slot<K>| match s {
                    Slot::Synced(Some(o)) => o.meta().resource_version.clone(),
                    _ => None,
                };
                let was = rv(&tx.borrow());
                let first = matches!(*tx.borrow(), Slot::Unsynced);
                let new = Slot::Synced(now.map(Arc::new));
                let changed = was != rv(&new);
                tx.send_replace(new);
                if changed && !first {
                    debug!(kind = key.kind, namespace = %key.namespace, name = %key.name, "object changed");
                    if let Some(c) = &changes {
                        let _ = c.send(key.clone());
                    }
                }
            }
        };
        tokio::select! {
            _ = generation.changed() => continue,
            _ = follow => return,
        }
    }
}

/// When a token got at `now` is asked for again: at 80 % of the life the
/// server granted (which may be shorter than asked for), or after 24 h,
/// whichever is first (upstream requiresRefresh, pkg/kubelet/token/
/// token_manager.go; its 0-10 s jitter is not kept).
fn token_refresh_at(now: i64, expires_at: i64) -> i64 {
    now + ((expires_at - now) * 4 / 5).min(24 * 3600)
}

/// Keeps `tx` equal to every Service in the cluster: list, watch, re-list
/// on 410 Gone, retry with backoff; the last set stays while the API
/// server is away.
async fn reflect_services(api: ApiClient, tx: watch::Sender<Option<Arc<ServiceMap>>>) {
    let mut generation = api.generation();
    let key = |s: &Service| {
        (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        )
    };
    loop {
        generation.borrow_and_update();
        let all: Api<Service> = Api::all(api.client().await);
        let cfg = watcher::Config::default().timeout(290);
        let mut stream = watcher(all, cfg).default_backoff().boxed();
        let follow = async {
            let mut listing: Option<ServiceMap> = None;
            while let Some(ev) = stream.next().await {
                let current = || tx.borrow().as_deref().cloned().unwrap_or_default();
                let next = match ev {
                    Ok(watcher::Event::Init) => {
                        listing = Some(ServiceMap::new());
                        continue;
                    }
                    Ok(watcher::Event::InitApply(s)) => {
                        if let Some(l) = listing.as_mut() {
                            l.insert(key(&s), Arc::new(s));
                        }
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => listing.take().unwrap_or_default(),
                    Ok(watcher::Event::Apply(s)) => {
                        let mut m = current();
                        m.insert(key(&s), Arc::new(s));
                        m
                    }
                    Ok(watcher::Event::Delete(s)) => {
                        let mut m = current();
                        m.remove(&key(&s));
                        m
                    }
                    Err(e) => {
                        warn!(error = %e, "watch of Services failed; retrying with backoff");
                        continue;
                    }
                };
                tx.send_replace(Some(Arc::new(next)));
            }
        };
        tokio::select! {
            _ = generation.changed() => continue,
            _ = follow => return,
        }
    }
}

/// The ConfigMaps and Secrets a pod reads, as upstream's
/// VisitPodConfigmapNames / VisitPodSecretNames find them: volumes
/// (configMap, secret, projected sources, CSI node-publish secrets),
/// env and envFrom of every container, init and ephemeral container, and
/// imagePullSecrets.
fn pod_refs(pod: &Pod) -> PodRefs {
    let mut r = PodRefs {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        ..Default::default()
    };
    let Some(spec) = pod.spec.as_ref() else {
        return r;
    };
    for s in spec.image_pull_secrets.iter().flatten() {
        r.secrets.insert(s.name.clone());
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            r.config_maps.insert(c.name.clone());
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            r.secrets.insert(s);
        }
        if let Some(s) = v
            .csi
            .as_ref()
            .and_then(|c| c.node_publish_secret_ref.as_ref())
        {
            r.secrets.insert(s.name.clone());
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &p.config_map {
                r.config_maps.insert(c.name.clone());
            }
            if let Some(s) = &p.secret {
                r.secrets.insert(s.name.clone());
            }
        }
    }
    let envs = spec
        .containers
        .iter()
        .map(|c| (&c.env, &c.env_from))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| (&c.env, &c.env_from)),
        )
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| (&c.env, &c.env_from)),
        );
    for (env, env_from) in envs {
        for e in env.iter().flatten() {
            let Some(vf) = &e.value_from else { continue };
            if let Some(k) = &vf.config_map_key_ref {
                r.config_maps.insert(k.name.clone());
            }
            if let Some(k) = &vf.secret_key_ref {
                r.secrets.insert(k.name.clone());
            }
        }
        for f in env_from.iter().flatten() {
            if let Some(c) = &f.config_map_ref {
                r.config_maps.insert(c.name.clone());
            }
            if let Some(s) = &f.secret_ref {
                r.secrets.insert(s.name.clone());
            }
        }
    }
    r.config_maps.retain(|n| !n.is_empty());
    r.secrets.retain(|n| !n.is_empty());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_refreshed_at_80_percent_of_their_life_or_after_24_hours() {
        let now = 1_000_000;
        assert_eq!(token_refresh_at(now, now + 3607), now + 2885);
        assert_eq!(token_refresh_at(now, now + 20), now + 16);
        // A 48 h token: after 24 h, not at 38.4 h.
        assert_eq!(token_refresh_at(now, now + 48 * 3600), now + 24 * 3600);
    }

    #[test]
    fn a_pods_references_cover_volumes_env_env_from_and_pull_secrets() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "sec-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"secret": {"name": "sec-proj"}},
                        {"serviceAccountToken": {"path": "token"}}]}}
                ],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "sec-init"}}]}],
                "containers": [{"name": "c", "env": [
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "k"}}}],
                    "envFrom": [{"configMapRef": {"name": "cm-from"}}]}]
            }
        }))
        .unwrap();
        let r = pod_refs(&pod);
        assert_eq!(r.namespace, "ns");
        assert_eq!(
            r.config_maps.into_iter().collect::<Vec<_>>(),
            ["cm-env", "cm-from", "cm-vol", "kube-root-ca.crt"]
        );
        assert_eq!(
            r.secrets.into_iter().collect::<Vec<_>>(),
            ["pull", "sec-env", "sec-init", "sec-proj", "sec-vol"]
        );
    }

    #[tokio::test]
    async fn without_an_api_server_getters_say_so_and_registration_watches_nothing() {
        let m = ObjectManager::new(
            Arc::new(OnceLock::new()),
            TaskTracker::new(),
            CancellationToken::new(),
        );
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "volumes": [{"name": "a", "configMap": {"name": "x"}}]}
        }))
        .unwrap();
        m.register_pod(&pod);
        assert_eq!(m.watched(), (0, 0));
        let e = m.config_map("ns", "x").await.unwrap_err();
        assert!(matches!(e, ObjectError::NoApiServer { .. }), "{e}");
        m.unregister_pod("u");
    }
}

#[cfg(test)]
mod refcount_tests {
    use super::*;

    fn pod(uid: &str, cms: &[&str]) -> Pod {
        let vols: Vec<serde_json::Value> = cms
            .iter()
            .map(|c| serde_json::json!({"name": c, "configMap": {"name": c}}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [], "volumes": vols,
                "imagePullSecrets": [{"name": "pull"}]}
        }))
        .unwrap()
    }

    /// A fake API server answering each request with `respond(n)` (n: the
    /// request's number from 1); returns its URL and the request count.
    async fn fake_api(
        respond: impl Fn(usize) -> (&'static str, String) + Send + Sync + 'static,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let gets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (g, respond) = (gets.clone(), Arc::new(respond));
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = l.accept().await.unwrap();
                let (g, respond) = (g.clone(), respond.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            // A POST's body follows its head.
                            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                            let body_len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() < end + 4 + body_len {
                                break;
                            }
                            buf.drain(..end + 4 + body_len);
                            let (code, body) = respond(g.fetch_add(1, Ordering::SeqCst) + 1);
                            let resp = format!(
                                "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if conn.write_all(resp.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, gets)
    }

    /// A tiny API server answering GETs of ConfigMap "cm" (resourceVersion
    /// = the number of GETs so far; 404 once `gone` is set): the GETs seen.
    async fn configmap_server(
        gone: Arc<std::sync::atomic::AtomicBool>,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        fake_api(move |n| {
            if gone.load(std::sync::atomic::Ordering::SeqCst) {
                ("404 Not Found", r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"configmaps \"cm\" not found"}"#.to_string())
            } else {
                (
                    "200 OK",
                    format!(
                        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm","namespace":"ns","resourceVersion":"{n}"}}}}"#
                    ),
                )
            }
        })
        .await
    }

    /// Upstream's token manager: a token is served from the cache until its
    /// refresh time, per (account, audiences, lifetime, bound pod). Without
    /// the cache every volume rewrite (each sync period) would ask again.
    #[tokio::test]
    async fn a_token_is_requested_once_and_served_from_the_cache_until_due() {
        use std::sync::atomic::Ordering;
        let (url, posts) = fake_api(|n| {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let exp = k8s_openapi::jiff::Timestamp::from_second(now + 3600).unwrap();
            (
                "201 Created",
                format!(
                    r#"{{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{{"audiences":[],"expirationSeconds":3600}},"status":{{"token":"t{n}","expirationTimestamp":"{exp}"}}}}"#
                ),
            )
        })
        .await;
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(ApiClient::new(client, 50, 100));
        let m = ObjectManager::new(slot, TaskTracker::new(), CancellationToken::new());
        let spec = |uid: &str| TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: Some(k8s_openapi::api::authentication::v1::BoundObjectReference {
                uid: Some(uid.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let get = |uid: &'static str| m.service_account_token("ns", "sa", spec(uid));
        assert_eq!(get("p1").await.unwrap().token, "t1");
        assert_eq!(get("p1").await.unwrap().token, "t1", "cached");
        assert_eq!(posts.load(Ordering::SeqCst), 1);
        assert_eq!(get("p2").await.unwrap().token, "t2", "another pod: its own");
        assert_eq!(posts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn the_cache_strategy_serves_within_its_ttl_and_refetches_on_registration() {
        use std::sync::atomic::Ordering;
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (url, gets) = configmap_server(gone.clone()).await;
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(ApiClient::new(client, 50, 100));
        let m = ObjectManager::new(slot, TaskTracker::new(), CancellationToken::new())
            .with_strategy(ChangeDetection::Cache, Duration::from_secs(60));
        let ttl = Arc::new(parking_lot::Mutex::new(Some(Duration::from_secs(3600))));
        let t = ttl.clone();
        m.set_ttl_source(Box::new(move || *t.lock()));
        let p = pod("a", &["cm"]);
        m.register_pod(&p);
        assert_eq!(m.watched(), (1, 1), "kept, not watched");
        let rv = |c: Arc<ConfigMap>| c.metadata.resource_version.clone().unwrap();
        assert_eq!(rv(m.config_map("ns", "cm").await.unwrap()), "1");
        assert_eq!(
            rv(m.config_map("ns", "cm").await.unwrap()),
            "1",
            "within the TTL"
        );
        assert_eq!(gets.load(Ordering::SeqCst), 1);
        // A pod (re)registered: read afresh (upstream's AddReference).
        m.register_pod(&pod("b", &["cm"]));
        assert_eq!(rv(m.config_map("ns", "cm").await.unwrap()), "2");
        // TTL 0 (the TTL controller's value for small clusters): every read.
        *ttl.lock() = Some(Duration::ZERO);
        assert_eq!(rv(m.config_map("ns", "cm").await.unwrap()), "3");
        // Gone: NotFound is cached like an object.
        gone.store(true, Ordering::SeqCst);
        assert!(m.config_map("ns", "cm").await.unwrap_err().is_not_found());

        // Get: nothing kept, every read a GET.
        let before = gets.load(Ordering::SeqCst);
        gone.store(false, Ordering::SeqCst);
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(ApiClient::new(client, 50, 100));
        let g = ObjectManager::new(slot, TaskTracker::new(), CancellationToken::new())
            .with_strategy(ChangeDetection::Get, Duration::from_secs(60));
        g.register_pod(&p);
        assert_eq!(g.watched(), (0, 0), "nothing kept");
        g.config_map("ns", "cm").await.unwrap();
        g.config_map("ns", "cm").await.unwrap();
        assert_eq!(gets.load(Ordering::SeqCst), before + 2);
    }

    #[tokio::test]
    async fn one_watch_per_object_shared_by_pods_and_closed_with_the_last() {
        // An API server nobody answers at: the watches start (and retry);
        // only their bookkeeping is looked at.
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(cfg).unwrap();
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(ApiClient::new(client, 50, 100));
        let (tasks, token) = (TaskTracker::new(), CancellationToken::new());
        let m = ObjectManager::new(slot, tasks.clone(), token.clone());
        m.register_pod(&pod("a", &["shared", "only-a"]));
        m.register_pod(&pod("b", &["shared"]));
        assert_eq!(
            m.watched(),
            (2, 1),
            "shared once, only-a once, one pull secret"
        );
        // An update of a pod that drops a reference releases it.
        m.register_pod(&pod("a", &["shared"]));
        assert_eq!(m.watched(), (1, 1));
        m.unregister_pod("a");
        assert_eq!(m.watched(), (1, 1), "b still references them");
        m.unregister_pod("b");
        assert_eq!(m.watched(), (0, 0));
        // Every watch task ends once released (cancelled), none is leaked.
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .expect("released watches stop");
        token.cancel();
    }
}
