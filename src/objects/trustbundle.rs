//! ClusterTrustBundles for `clusterTrustBundle` projected volume sources
//! (upstream `pkg/kubelet/clustertrustbundle`): the lazy manager that picks
//! the API version by discovery on first use (v1beta1, then v1alpha1), one
//! cluster-wide watch of every bundle (upstream's informer; nodes may read
//! them), and the PEM normalization written into pods.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ClusterTrustBundleProjection;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::{broadcast, watch};
use tracing::{info, warn};

use super::{ObjectKey, ObjectManager};
use crate::apiclient::ApiClient;
use crate::config::features;

/// The kubelet's feature gate for the projection (beta, off by default in
/// 1.34).
pub const FEATURE_GATE: &str = "ClusterTrustBundleProjection";

/// The kind `ObjectKey`s of bundle changes carry (cluster-scoped: no
/// namespace).
pub const KIND: &str = "clustertrustbundle";

/// The group versions tried, in upstream's order of preference (1.34).
const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
const GROUP: &str = "certificates.k8s.io";
/// How long the first use waits for the new watch's first list (upstream
/// waits 10 s for the informer to sync, then carries on in the background).
const FIRST_SYNC_WAIT: Duration = Duration::from_secs(10);
/// Upstream's maxLabelSelectorLength, on the selector's string form.
const MAX_SELECTOR_LEN: usize = 100 * 1024;

/// Errors, in upstream's words (`clustertrustbundle_manager.go`,
/// `projected.go`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustBundleError {
    /// The NoopManager's answer: no API server, the feature gate off, or no
    /// version of the API served.
    #[error("ClusterTrustBundle projection is not supported in static kubelet mode")]
    Unsupported,
    #[error("failed to ensure informer manager for ClusterTrustBundles: failed to determine which informer manager to choose: {0}")]
    Discovery(String),
    #[error("ClusterTrustBundle informer has not yet synced")]
    NotSynced,
    /// The lister's NotFound, wrapped.
    #[error(
        "while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io {0:?} not found"
    )]
    NotFound(String),
    #[error("while parsing label selector: {0}")]
    Selector(String),
    #[error("label selector length ({0}) is larger than {MAX_SELECTOR_LEN}")]
    SelectorTooLong(usize),
    #[error("combination of signerName and labelSelector matched zero ClusterTrustBundles")]
    NoneMatched,
    #[error("ClusterTrustBundle projection requires either name or signerName to be set")]
    NoNameOrSigner,
}

/// What the kubelet keeps of a bundle: only the fields it reads, so the
/// cache costs about the size of the PEM text (no managedFields,
/// annotations).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bundle {
    pub signer_name: String,
    pub labels: BTreeMap<String, String>,
    pub trust_bundle: String,
}

/// Every bundle by name.
pub type Bundles = BTreeMap<String, Arc<Bundle>>;

/// The manager's state, kept in the object manager.
#[derive(Default)]
pub(super) struct TrustBundles {
    /// The feature gate (unset: its default).
    gate: OnceLock<bool>,
    /// Chosen on first use with an API client (upstream's
    /// LazyInformerManager); a failed discovery leaves it unset.
    backend: tokio::sync::OnceCell<Backend>,
}

enum Backend {
    /// No version of the API is served.
    Noop,
    /// The watch's view; None until its first list.
    Watch(watch::Receiver<Option<Arc<Bundles>>>),
}

impl ObjectManager {
    /// Sets the ClusterTrustBundleProjection feature gate (before pods come).
    pub fn with_cluster_trust_bundle_projection(self, enabled: bool) -> Self {
        let _ = self.inner.trust_bundles.gate.set(enabled);
        self
    }

    /// The PEM file a clusterTrustBundle projection writes (upstream
    /// GetTrustAnchorsByName / GetTrustAnchorsBySigner behind the lazy
    /// manager): deduplicated certificates, in an order fixed for the life
    /// of the process.
    pub async fn trust_anchors(
        &self,
        proj: &ClusterTrustBundleProjection,
    ) -> Result<Vec<u8>, TrustBundleError> {
        if proj.name.is_none() && proj.signer_name.is_none() {
            return Err(TrustBundleError::NoNameOrSigner);
        }
        let bundles = self.trust_bundles().await?;
        anchors(&bundles, proj, process_order())
    }

    async fn trust_bundles(&self) -> Result<Arc<Bundles>, TrustBundleError> {
        let tb = &self.inner.trust_bundles;
        let enabled = tb
            .gate
            .get()
            .copied()
            .unwrap_or_else(|| features::default_of(FEATURE_GATE));
        // Upstream builds the NoopManager without a client (static pods)
        // or with the gate off.
        let Some(api) = self.api.get().filter(|_| enabled) else {
            return Err(TrustBundleError::Unsupported);
        };
        let backend = tb
            .backend
            .get_or_try_init(|| self.start_trust_bundle_watch(api))
            .await?;
        match backend {
            Backend::Noop => Err(TrustBundleError::Unsupported),
            Backend::Watch(rx) => rx.borrow().clone().ok_or(TrustBundleError::NotSynced),
        }
    }

    /// Discovery, then the watch of the first version served; waits for its
    /// first list at most FIRST_SYNC_WAIT.
    async fn start_trust_bundle_watch(&self, api: &ApiClient) -> Result<Backend, TrustBundleError> {
        let client = api.client().await;
        let mut found = None;
        for version in VERSIONS {
            let gv = format!("{GROUP}/{version}");
            match client.list_api_group_resources(&gv).await {
                Ok(list)
                    if list
                        .resources
                        .iter()
                        .any(|r| r.name == "clustertrustbundles") =>
                {
                    found = Some(version);
                    break;
                }
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(TrustBundleError::Discovery(e.to_string())),
            }
        }
        let Some(version) = found else {
            info!("No version of the ClusterTrustBundle API was found, the ClusterTrustBundle informer won't be started");
            return Ok(Backend::Noop);
        };
        let (tx, mut rx) = watch::channel(None);
        let Some((tasks, token)) = self.inner.tasks.get() else {
            // No task runtime (unit tests): nothing can follow the bundles.
            return Ok(Backend::Watch(rx));
        };
        let (api, token) = (api.clone(), token.clone());
        let changes = self.inner.changes.get().cloned();
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = reflect_bundles(api, version, tx, changes) => {}
                }
            },
            tracing::info_span!("clustertrustbundle-watch", version),
        ));
        info!(api_group = %format!("{GROUP}/{version}"), "Started ClusterTrustBundle informer");
        if tokio::time::timeout(FIRST_SYNC_WAIT, rx.wait_for(|b| b.is_some()))
            .await
            .is_err()
        {
            info!("ClusterTrustBundle informer not synced, continuing to attempt in background");
        }
        Ok(Backend::Watch(rx))
    }
}

fn bundle_of(o: &DynamicObject) -> (String, Bundle) {
    let s = |k: &str| {
        o.data
            .pointer(&format!("/spec/{k}"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    (
        o.metadata.name.clone().unwrap_or_default(),
        Bundle {
            signer_name: s("signerName"),
            labels: o.metadata.labels.clone().unwrap_or_default(),
            trust_bundle: s("trustBundle"),
        },
    )
}

/// Keeps `tx` equal to every ClusterTrustBundle: list, watch, re-list on
/// 410 Gone, retry with backoff; the last set stays while the API server
/// is away. Each bundle that changes is announced on `changes`, so volumes
/// that project bundles are written again.
async fn reflect_bundles(
    api: ApiClient,
    version: &'static str,
    tx: watch::Sender<Option<Arc<Bundles>>>,
    changes: Option<broadcast::Sender<ObjectKey>>,
) {
    let ar = ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: "ClusterTrustBundle".into(),
        plural: "clustertrustbundles".into(),
    };
    let announce = |name: &str| {
        if let Some(c) = &changes {
            let _ = c.send(ObjectKey {
                kind: KIND,
                namespace: String::new(),
                name: name.to_string(),
            });
        }
    };
    let mut generation = api.generation();
    loop {
        generation.borrow_and_update();
        let all: Api<DynamicObject> = Api::all_with(api.client().await, &ar);
        let cfg = watcher::Config::default().timeout(290);
        let mut stream = watcher(all, cfg).default_backoff().boxed();
        let follow = async {
            let mut listing: Option<Bundles> = None;
            while let Some(ev) = stream.next().await {
                let current = tx.borrow().as_deref().cloned();
                let next = match ev {
                    Ok(watcher::Event::Init) => {
                        listing = Some(Bundles::new());
                        continue;
                    }
                    Ok(watcher::Event::InitApply(o)) => {
                        if let Some(l) = listing.as_mut() {
                            let (name, b) = bundle_of(&o);
                            l.insert(name, Arc::new(b));
                        }
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => listing.take().unwrap_or_default(),
                    Ok(watcher::Event::Apply(o)) => {
                        let mut m = current.clone().unwrap_or_default();
                        let (name, b) = bundle_of(&o);
                        m.insert(name, Arc::new(b));
                        m
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        let mut m = current.clone().unwrap_or_default();
                        m.remove(&bundle_of(&o).0);
                        m
                    }
                    Err(e) => {
                        warn!(error = %e, "watch of ClusterTrustBundles failed; retrying with backoff");
                        continue;
                    }
                };
                // Announce what differs (a re-list may bring several).
                if let Some(old) = &current {
                    let names: BTreeSet<&String> = old.keys().chain(next.keys()).collect();
                    for n in names {
                        if old.get(n) != next.get(n) {
                            announce(n);
                        }
                    }
                }
                tx.send_replace(Some(Arc::new(next)));
            }
        };
        tokio::select! {
            _ = generation.changed() => continue,
            _ = follow => return,
        }
    }
}

/// The order certificates are written in: upstream shuffles them so that
/// no consumer relies on an order ("stable ordering that changes each time
/// Kubelet restarts"); a hash keyed once per process gives that, and the
/// same bytes for the same set on every rewrite.
fn process_order() -> &'static std::hash::RandomState {
    static ORDER: OnceLock<std::hash::RandomState> = OnceLock::new();
    ORDER.get_or_init(std::hash::RandomState::new)
}

/// The projection's file from the bundles, as upstream's
/// GetTrustAnchorsByName / GetTrustAnchorsBySigner.
pub fn anchors(
    bundles: &Bundles,
    proj: &ClusterTrustBundleProjection,
    order: &impl BuildHasher,
) -> Result<Vec<u8>, TrustBundleError> {
    let allow_missing = proj.optional.unwrap_or(false);
    if let Some(name) = &proj.name {
        return match bundles.get(name) {
            Some(b) => Ok(normalize([b.trust_bundle.as_str()], order)),
            None if allow_missing => Ok(Vec::new()),
            None => Err(TrustBundleError::NotFound(name.clone())),
        };
    }
    let Some(signer) = &proj.signer_name else {
        return Err(TrustBundleError::NoNameOrSigner);
    };
    let selector = Selector::new(proj.label_selector.as_ref())?;
    let len = selector.string_len();
    if len > MAX_SELECTOR_LEN {
        return Err(TrustBundleError::SelectorTooLong(len));
    }
    let picked: Vec<&str> = bundles
        .values()
        .filter(|b| selector.matches(&b.labels) && b.signer_name == *signer)
        .map(|b| b.trust_bundle.as_str())
        .collect();
    if picked.is_empty() {
        if allow_missing {
            return Ok(Vec::new());
        }
        return Err(TrustBundleError::NoneMatched);
    }
    Ok(normalize(picked, order))
}

/// upstream normalizeTrustAnchors: every PEM block of every bundle,
/// deduplicated by content, written back as CERTIFICATE blocks without
/// headers or text between them.
pub fn normalize<'a>(
    bundles: impl IntoIterator<Item = &'a str>,
    order: &impl BuildHasher,
) -> Vec<u8> {
    let mut set: BTreeSet<Vec<u8>> = BTreeSet::new();
    for b in bundles {
        let mut rest = b.as_bytes();
        while let Some((der, after)) = pem_decode(rest) {
            set.insert(der);
            rest = after;
        }
    }
    let mut list: Vec<(u64, Vec<u8>)> = set.into_iter().map(|d| (order.hash_one(&d), d)).collect();
    list.sort();
    let mut out = Vec::new();
    for (_, der) in list {
        pem_encode(&der, &mut out);
    }
    out
}

/// Go's pem.EncodeToMemory of a CERTIFICATE block: base64 in 64-column
/// lines.
fn pem_encode(der: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    for line in b64.as_bytes().chunks(64) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.extend_from_slice(b"-----END CERTIFICATE-----\n");
}

/// Go's getLine: up to the next '\n' with trailing spaces, tabs and '\r'
/// removed, and what follows it.
fn get_line(data: &[u8]) -> (&[u8], &[u8]) {
    let (line, rest) = match data.iter().position(|&c| c == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    let end = line
        .iter()
        .rposition(|&c| !matches!(c, b' ' | b'\t' | b'\r'))
        .map_or(0, |i| i + 1);
    (&line[..end], rest)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Go's pem.Decode: the next well-formed block's bytes (any type, headers
/// skipped) and the data after it; text between blocks and malformed
/// blocks are passed over.
fn pem_decode(data: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    const START: &[u8] = b"\n-----BEGIN ";
    const END: &[u8] = b"\n-----END ";
    const DASHES: &[u8] = b"-----";
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let mut rest = data;
    loop {
        if rest.starts_with(&START[1..]) {
            rest = &rest[START.len() - 1..];
        } else if let Some(i) = find(rest, START) {
            rest = &rest[i + START.len()..];
        } else {
            return None;
        }
        let (type_line, after) = get_line(rest);
        rest = after;
        let Some(typ) = type_line.strip_suffix(DASHES) else {
            continue;
        };
        // Headers ("Key: value" lines) are dropped.
        let mut headers = 0;
        loop {
            if rest.is_empty() {
                return None;
            }
            let (line, next) = get_line(rest);
            if !line.contains(&b':') {
                break;
            }
            headers += 1;
            rest = next;
        }
        let (end_at, trailer_at) = if headers == 0 && rest.starts_with(&END[1..]) {
            (0, END.len() - 1)
        } else {
            match find(rest, END) {
                Some(i) => (i, i + END.len()),
                None => continue,
            }
        };
        let trailer = &rest[trailer_at..];
        let want = typ.len() + DASHES.len();
        if trailer.len() < want
            || !trailer[..want].starts_with(typ)
            || !trailer[..want].ends_with(DASHES)
            || !get_line(&trailer[want..]).0.is_empty()
        {
            continue;
        }
        // Go's decoder skips '\r' and '\n'; spaces and tabs are removed
        // first.
        let b64: Vec<u8> = rest[..end_at]
            .iter()
            .copied()
            .filter(|c| !matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
            .collect();
        let Ok(der) = engine.decode(&b64) else {
            continue;
        };
        let (_, after) = get_line(&rest[end_at + END.len() - 1..]);
        return Some((der, after));
    }
}

/// metav1.LabelSelectorAsSelector as the manager uses it: no selector
/// matches nothing, an empty one everything.
#[derive(Debug, Clone, PartialEq)]
enum Selector {
    Nothing,
    /// Every requirement must hold (none: everything).
    All(Vec<Requirement>),
}

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    /// From matchLabels.
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    fn new(ls: Option<&LabelSelector>) -> Result<Selector, TrustBundleError> {
        let Some(ls) = ls else {
            return Ok(Selector::Nothing);
        };
        let mut reqs = Vec::new();
        for (k, v) in ls.match_labels.iter().flatten() {
            reqs.push(Requirement::Equals(k.clone(), v.clone()));
        }
        for e in ls.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            let bad = |why: &str| {
                Err(TrustBundleError::Selector(format!(
                    "values: Invalid value: {values:?}: {why}"
                )))
            };
            let key = e.key.clone();
            reqs.push(match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return bad("for 'in', 'notin' operators, values set can't be empty")
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return bad("values set must be empty for exists and does not exist")
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(TrustBundleError::Selector(format!(
                        "{other:?} is not a valid label selector operator"
                    )))
                }
            });
        }
        Ok(Selector::All(reqs))
    }

    /// The length of the selector's string form as Go's labels package
    /// writes it (`k=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined
    /// by commas), which upstream bounds.
    fn string_len(&self) -> usize {
        let Selector::All(reqs) = self else {
            return 0;
        };
        let values = |vs: &[String]| vs.iter().map(String::len).sum::<usize>() + vs.len() - 1;
        let each: usize = reqs
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => k.len() + 1 + v.len(),
                Requirement::In(k, vs) => k.len() + " in ()".len() + values(vs),
                Requirement::NotIn(k, vs) => k.len() + " notin ()".len() + values(vs),
                Requirement::Exists(k) => k.len(),
                Requirement::DoesNotExist(k) => k.len() + 1,
            })
            .sum();
        each + reqs.len().saturating_sub(1)
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let Selector::All(reqs) = self else {
            return false;
        };
        reqs.iter().all(|r| match r {
            Requirement::Equals(k, want) => labels.get(k) == Some(want),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::hash::BuildHasherDefault;

    type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

    fn pem(der: &[u8]) -> String {
        let mut out = Vec::new();
        pem_encode(der, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// The DER contents of a PEM text, in order.
    fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = pem;
        while let Some((d, after)) = pem_decode(rest) {
            out.push(d);
            rest = after;
        }
        out
    }

    fn bundle(signer: &str, labels: &[(&str, &str)], certs: &[&[u8]]) -> Arc<Bundle> {
        Arc::new(Bundle {
            signer_name: signer.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            trust_bundle: certs.iter().map(|c| pem(c)).collect(),
        })
    }

    fn by_signer(signer: &str, sel: Option<LabelSelector>) -> ClusterTrustBundleProjection {
        ClusterTrustBundleProjection {
            signer_name: Some(signer.into()),
            label_selector: sel,
            path: "ca.pem".into(),
            ..Default::default()
        }
    }

    fn by_name(name: &str) -> ClusterTrustBundleProjection {
        ClusterTrustBundleProjection {
            name: Some(name.into()),
            path: "ca.pem".into(),
            ..Default::default()
        }
    }

    #[test]
    fn pem_blocks_are_read_as_gos_decoder_reads_them() {
        // Text around and between blocks, headers, CRLF line ends and a
        // block without a matching END are passed over.
        let text = "junk before\n-----BEGIN CERTIFICATE-----\r\nAQID\r\n-----END CERTIFICATE-----\r\n\
                    comment\n-----BEGIN CERTIFICATE-----\nProc-Type: 4,ENCRYPTED\n\nBAUG\n-----END CERTIFICATE-----\n\
                    -----BEGIN BROKEN-----\nBwgJ\n-----END OTHER-----\n\
                    -----BEGIN CERTIFICATE-----\nCgsM\n-----END CERTIFICATE-----";
        assert_eq!(
            ders(text.as_bytes()),
            vec![vec![1, 2, 3], vec![4, 5, 6], vec![10, 11, 12]]
        );
        assert!(ders(b"no pem here").is_empty());
        // Bad base64 is skipped, the next block still read.
        let text = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nAQID\n-----END CERTIFICATE-----\n";
        assert_eq!(ders(text.as_bytes()), vec![vec![1, 2, 3]]);
    }

    #[test]
    fn normalization_deduplicates_strips_and_fixes_one_order() {
        let long = vec![7u8; 100];
        let a = format!(
            "# a comment\n{}{}",
            pem(&[1, 2, 3]),
            pem(&long).replace("-----\n", "-----\nHeader: x\n\n")
        );
        let b = format!("{}\n\n{}", pem(&[1, 2, 3]), pem(&[9, 9]));
        let out = normalize([a.as_str(), b.as_str()], &Fixed::default());
        let got = ders(&out);
        assert_eq!(got.len(), 3, "one copy of each certificate");
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, vec![vec![1, 2, 3], long.clone(), vec![9, 9]]);
        // Only the blocks, as Go's encoder writes them: 64 columns, no text.
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(!text.contains("comment") && !text.contains("Header"));
        assert!(text.lines().all(|l| l.len() <= 64));
        assert_eq!(text.matches("-----BEGIN CERTIFICATE-----\n").count(), 3);
        // The same set in any order, or with more copies, gives the same
        // bytes: a rewrite changes nothing.
        let again = normalize([b.as_str(), a.as_str(), b.as_str()], &Fixed::default());
        assert_eq!(again, out);
        // The order is the key's, not the input's: some other key orders
        // the same set differently.
        let orders: BTreeSet<Vec<u8>> = (0..32)
            .map(|_| normalize([a.as_str(), b.as_str()], &std::hash::RandomState::new()))
            .collect();
        assert!(orders.len() > 1, "the order depends on the process's key");
    }

    #[test]
    fn by_name_reads_one_bundle_and_optional_forgives_a_missing_one() {
        let bundles = Bundles::from([
            ("one".to_string(), bundle("", &[], &[&[1], &[2], &[1]])),
            (
                "example.com:s:x".to_string(),
                bundle("example.com/s", &[], &[&[3]]),
            ),
        ]);
        let f = Fixed::default();
        let got = anchors(&bundles, &by_name("one"), &f).unwrap();
        let mut d = ders(&got);
        d.sort();
        assert_eq!(d, vec![vec![1], vec![2]]);
        // A signer's bundle is also reachable by its name.
        assert_eq!(
            ders(&anchors(&bundles, &by_name("example.com:s:x"), &f).unwrap()),
            vec![vec![3]]
        );
        let e = anchors(&bundles, &by_name("nope"), &f).unwrap_err();
        assert_eq!(
            e.to_string(),
            "while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io \"nope\" not found"
        );
        let mut opt = by_name("nope");
        opt.optional = Some(true);
        assert_eq!(anchors(&bundles, &opt, &f).unwrap(), Vec::<u8>::new());
        // Neither name nor signer.
        let none = ClusterTrustBundleProjection::default();
        assert_eq!(
            anchors(&bundles, &none, &f).unwrap_err().to_string(),
            "ClusterTrustBundle projection requires either name or signerName to be set"
        );
    }

    #[test]
    fn by_signer_a_missing_selector_matches_nothing_and_an_empty_one_everything() {
        let s = "example.com/s";
        let bundles = Bundles::from([
            (
                "example.com:s:a".to_string(),
                bundle(s, &[("env", "prod")], &[&[1]]),
            ),
            (
                "example.com:s:b".to_string(),
                bundle(s, &[("env", "dev")], &[&[2], &[1]]),
            ),
            ("example.com:s:c".to_string(), bundle(s, &[], &[&[3]])),
            (
                "example.com:t:a".to_string(),
                bundle("example.com/t", &[("env", "prod")], &[&[4]]),
            ),
            ("plain".to_string(), bundle("", &[("env", "prod")], &[&[5]])),
        ]);
        let f = Fixed::default();
        let picked = |sel: Option<LabelSelector>| -> Result<Vec<Vec<u8>>, TrustBundleError> {
            let mut d = ders(&anchors(&bundles, &by_signer(s, sel), &f)?);
            d.sort();
            Ok(d)
        };
        // No selector: "match nothing", an error unless optional.
        assert_eq!(picked(None), Err(TrustBundleError::NoneMatched));
        assert_eq!(
            TrustBundleError::NoneMatched.to_string(),
            "combination of signerName and labelSelector matched zero ClusterTrustBundles"
        );
        let mut opt = by_signer(s, None);
        opt.optional = Some(true);
        assert_eq!(anchors(&bundles, &opt, &f).unwrap(), Vec::<u8>::new());
        // Empty: every bundle of the signer, merged and deduplicated; other
        // signers' and unsigned bundles never.
        assert_eq!(
            picked(Some(LabelSelector::default())).unwrap(),
            vec![vec![1], vec![2], vec![3]]
        );
        let labels = |k: &str, v: &str| LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
            ..Default::default()
        };
        assert_eq!(picked(Some(labels("env", "prod"))).unwrap(), vec![vec![1]]);
        let expr = |op: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: op.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert_eq!(
            picked(Some(expr("In", &["dev", "prod"]))).unwrap(),
            vec![vec![1], vec![2]]
        );
        assert_eq!(
            picked(Some(expr("NotIn", &["prod"]))).unwrap(),
            vec![vec![1], vec![2], vec![3]],
            "NotIn matches a bundle without the label"
        );
        assert_eq!(
            picked(Some(expr("Exists", &[]))).unwrap(),
            vec![vec![1], vec![2]]
        );
        assert_eq!(
            picked(Some(expr("DoesNotExist", &[]))).unwrap(),
            vec![vec![3]]
        );
        assert_eq!(
            picked(Some(labels("env", "qa"))),
            Err(TrustBundleError::NoneMatched)
        );
        let e = picked(Some(expr("Near", &["x"]))).unwrap_err().to_string();
        assert_eq!(
            e,
            "while parsing label selector: \"Near\" is not a valid label selector operator"
        );
        assert!(picked(Some(expr("In", &[]))).is_err());
        // upstream's bound on the selector's string form.
        let big = labels("env", &"x".repeat(100 * 1024));
        assert_eq!(
            picked(Some(big)),
            Err(TrustBundleError::SelectorTooLong(4 + 100 * 1024))
        );
        let two = LabelSelector {
            match_labels: Some(BTreeMap::from([("a".to_string(), "1".to_string())])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "b".into(),
                operator: "NotIn".into(),
                values: Some(vec!["x".into(), "yz".into()]),
            }]),
        };
        // "a=1,b notin (x,yz)"
        assert_eq!(Selector::new(Some(&two)).unwrap().string_len(), 18);
    }

    /// A tiny API server: `answer(path)` gives (status, body); a watch is
    /// answered with headers only and held open. Returns its URL and the
    /// paths asked for.
    async fn fake_server(
        answer: fn(&str) -> (u16, String),
    ) -> (String, Arc<parking_lot::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = l.accept().await.unwrap();
                let s = s.clone();
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
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            let path = head.split(' ').nth(1).unwrap_or("").to_string();
                            s.lock().push(path.clone());
                            if path.contains("watch=") {
                                let _ = conn
                                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                                    .await;
                                std::future::pending::<()>().await;
                            }
                            let (code, body) = answer(&path);
                            let resp = format!(
                                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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
        (url, seen)
    }

    fn manager_at(url: &str) -> (ObjectManager, tokio_util::sync::CancellationToken) {
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(ApiClient::new(client, 50, 100));
        let token = tokio_util::sync::CancellationToken::new();
        let m = ObjectManager::new(slot, tokio_util::task::TaskTracker::new(), token.clone())
            .with_cluster_trust_bundle_projection(true);
        (m, token)
    }

    const NOT_FOUND: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"the server could not find the requested resource"}"#;

    #[tokio::test]
    async fn no_version_served_is_static_modes_error_for_good() {
        let (url, seen) = fake_server(|_| (404, NOT_FOUND.to_string())).await;
        let (m, token) = manager_at(&url);
        for _ in 0..2 {
            assert_eq!(
                m.trust_anchors(&by_name("x")).await,
                Err(TrustBundleError::Unsupported)
            );
        }
        // v1beta1 then v1alpha1, asked once: upstream's lazy manager keeps
        // its no-op manager.
        assert_eq!(
            *seen.lock(),
            [
                "/apis/certificates.k8s.io/v1beta1",
                "/apis/certificates.k8s.io/v1alpha1"
            ]
        );
        token.cancel();
    }

    #[tokio::test]
    async fn without_v1beta1_the_v1alpha1_api_is_watched() {
        let (url, seen) = fake_server(|path| {
            let ca = pem(&[1, 2, 3]).replace('\n', "\\n");
            match path {
                "/apis/certificates.k8s.io/v1alpha1" => (200, r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"certificates.k8s.io/v1alpha1","resources":[{"name":"clustertrustbundles","singularName":"clustertrustbundle","namespaced":false,"kind":"ClusterTrustBundle","verbs":["get","list","watch"]}]}"#.to_string()),
                p if p.starts_with("/apis/certificates.k8s.io/v1alpha1/clustertrustbundles?") => (200, format!(
                    r#"{{"kind":"ClusterTrustBundleList","apiVersion":"certificates.k8s.io/v1alpha1","metadata":{{"resourceVersion":"5"}},"items":[{{"metadata":{{"name":"example.com:s:a","resourceVersion":"4","labels":{{"k":"v"}}}},"spec":{{"signerName":"example.com/s","trustBundle":"{ca}"}}}}]}}"#
                )),
                _ => (404, NOT_FOUND.to_string()),
            }
        })
        .await;
        let (m, token) = manager_at(&url);
        let sel = LabelSelector {
            match_labels: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
            ..Default::default()
        };
        let got = m
            .trust_anchors(&by_signer("example.com/s", Some(sel)))
            .await
            .unwrap();
        assert_eq!(ders(&got), vec![vec![1, 2, 3]]);
        assert!(seen
            .lock()
            .iter()
            .any(|p| p.starts_with("/apis/certificates.k8s.io/v1alpha1/clustertrustbundles?")));
        token.cancel();
    }

    #[tokio::test]
    async fn without_an_api_server_or_with_the_gate_off_it_is_static_modes_error() {
        let proj = by_name("x");
        // No client: static kubelet mode, whatever the gate.
        let m = ObjectManager::default().with_cluster_trust_bundle_projection(true);
        assert_eq!(
            m.trust_anchors(&proj).await.unwrap_err().to_string(),
            "ClusterTrustBundle projection is not supported in static kubelet mode"
        );
        // A client but the gate at its 1.34 default (off): the same.
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(ApiClient::new(
            kube::Client::try_from(cfg).unwrap(),
            50,
            100,
        ));
        let m = ObjectManager::new(
            slot,
            tokio_util::task::TaskTracker::new(),
            tokio_util::sync::CancellationToken::new(),
        );
        assert_eq!(
            m.trust_anchors(&proj).await,
            Err(TrustBundleError::Unsupported)
        );
        // The gate on, the API server unreachable: discovery fails and is
        // tried again on the next use.
        let m = m.with_cluster_trust_bundle_projection(true);
        let e = m.trust_anchors(&proj).await.unwrap_err();
        assert!(matches!(e, TrustBundleError::Discovery(_)), "{e}");
        assert!(m.inner.trust_bundles.backend.get().is_none());
    }
}
