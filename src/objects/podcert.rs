//! Pod certificates for `podCertificate` projected volume sources (upstream
//! `pkg/kubelet/podcertificate`, 1.34, gate `PodCertificateRequest`): per
//! (pod, volume, source) a private key the kubelet generates, a
//! `PodCertificateRequest` (certificates.k8s.io/v1alpha1) with a proof of
//! possession, and upstream's state machine (initial → wait → fresh →
//! waitrefresh, denied and failed for good).
//!
//! Upstream drives the machine from a work queue fed by an informer on the
//! node's PodCertificateRequests (`spec.nodeName=<node>`); here the volume
//! set-up steps it, and a watch scoped the same way (running while a pod
//! on the node has a podCertificate source) keeps what the machine reads
//! of each request and wakes the pod's volume set-up when a request it
//! waits on is issued, denied or failed. While that watch is down, the
//! set-up reads the request with a GET instead (its backoff is the poll).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1alpha1::{PodCertificateRequest, PodCertificateRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, PodCertificateProjection, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use parking_lot::Mutex;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{ObjectKey, ObjectManager};
use crate::apiclient::ApiClient;
use crate::config::features;

/// The kubelet's feature gate for the projection (alpha, off in 1.34).
pub const FEATURE_GATE: &str = "PodCertificateRequest";

/// The kind of the `ObjectKey`s that announce a request the manager waits
/// on reaching a terminal state; their `name` is the pod's UID (upstream's
/// informer handlers queue every projection of `spec.podUID`).
pub const KIND: &str = "podcertificaterequest";

/// How often a pending refresh request is looked at again while the watch
/// of requests is down (upstream's informer would wake the projection at
/// once; without it, a short poll).
const REFRESH_POLL: i64 = 10;
/// ... and while the watch follows the requests, which wakes the volume
/// when the refresh request is issued: upstream's refresh pass re-queues
/// every projection about once a minute.
const REFRESH_PASS: i64 = 60;
/// upstream assumeDeletedThreshold: a request the watch does not know this
/// long (plus jitter) after its creation is taken as deleted, and made
/// again.
const ASSUME_DELETED_AFTER: i64 = 600;
/// How long one key generation may take before the volume reports it
/// (an RSA4096 prime search takes seconds on a busy node; this is far
/// past it).
const KEYGEN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);
/// upstream jitterDuration: up to 5 minutes, so that projections issued
/// together do not all ask for their refresh at once.
const JITTER_MAX: i64 = 300;

/// Errors, in upstream's words (`podcertificatemanager.go`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodCertError {
    /// The NoOpManager's answer: no API server (static pods) or the gate
    /// off.
    #[error("unimplemented")]
    Unsupported,
    /// Waiting for the signer (credStateInitial / credStateWait).
    #[error("credential bundle is not issued yet")]
    NotIssued,
    #[error("PodCertificateRequest was permanently denied: reason={reason:?} message={message:?}")]
    Denied { reason: String, message: String },
    #[error("PodCertificateRequest was permanently failed: reason={reason:?} message={message:?}")]
    Failed { reason: String, message: String },
    #[error("while generating keypair: unknown key type {0:?}")]
    UnknownKeyType(String),
    #[error("while generating keypair: {0}")]
    KeyGeneration(String),
    #[error("while fetching service account: {0}")]
    ServiceAccount(String),
    #[error("while getting node object: {0}")]
    Node(String),
    #[error("while creating {which} PodCertificateRequest: while creating on API: {message}")]
    Create {
        which: &'static str,
        message: String,
    },
    #[error("while getting PodCertificateRequest {name:?}: {message}")]
    Get { name: String, message: String },
}

impl PodCertError {
    /// rkubelet's own failures, which the volume reports (upstream would
    /// have made the key): every other error of a step is logged, and the
    /// volume reads the state as it is, as upstream's does.
    fn surfaced(&self) -> bool {
        matches!(self, PodCertError::KeyGeneration(_))
    }
}

/// What a podCertificate source writes: the PKCS#8 private key PEM, the
/// issued chain as the signer wrote it, and when to look again (unix
/// seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub private_key: Vec<u8>,
    pub chain: Vec<u8>,
    pub recheck_at: i64,
}

/// upstream projectionKey (with the pod UID, so a pod re-created under the
/// same name starts afresh).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProjectionKey {
    namespace: String,
    pod_name: String,
    pod_uid: String,
    volume: String,
    source_index: usize,
}

/// upstream's credState; a key absent from the map is credStateInitial.
/// Times are unix seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CredState {
    Wait {
        private_key: Vec<u8>,
        pcr: String,
        /// Not found after this: taken as deleted (upstream pcrAbandonAt).
        abandon_at: i64,
    },
    Denied {
        reason: String,
        message: String,
    },
    Failed {
        reason: String,
        message: String,
    },
    Fresh {
        private_key: Vec<u8>,
        chain: Vec<u8>,
        /// The request's beginRefreshAt plus the jitter drawn at issuance.
        begin_refresh_at: i64,
    },
    WaitRefresh {
        private_key: Vec<u8>,
        chain: Vec<u8>,
        begin_refresh_at: i64,
        refresh_key: Vec<u8>,
        refresh_pcr: String,
        abandon_at: i64,
    },
}

/// The store of states, shared with the watch task (which reads which
/// requests are waited on).
type Store = Arc<Mutex<HashMap<ProjectionKey, CredState>>>;

/// The manager's state, kept in the object manager.
#[derive(Default)]
pub(super) struct PodCerts {
    gate: std::sync::OnceLock<bool>,
    store: Store,
    tracked: Arc<Mutex<Tracked>>,
}

/// The pods the watch is for, and the watch.
#[derive(Default)]
struct Tracked {
    /// UIDs of the pods in the pod manager with a podCertificate source.
    pods: HashSet<String>,
    /// The running watch; stopped when `pods` empties.
    watch: Option<Running>,
    /// Numbers the watches, so a stopped one's last writes go nowhere.
    epoch: u64,
}

struct Running {
    epoch: u64,
    cancel: CancellationToken,
    view: View,
}

/// What the watch keeps of a request: its pod and what its conditions
/// say, nothing else (no spec, keys or managed fields).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    pod_uid: String,
    observed: Observed,
}

/// The watch's view of the node's requests, for tracked pods only.
#[derive(Debug, Default)]
struct View {
    /// Listed and following, no error since: a request it does not hold
    /// may still be there (lag), but one it holds is as the server has it.
    healthy: bool,
    requests: HashMap<(String, String), Seen>,
    /// A (re-)list in progress.
    listing: Option<HashMap<(String, String), Seen>>,
}

/// A request that reached a terminal state: (namespace, name, pod UID).
type Woken = (String, String, String);

fn pcr_key(pcr: &PodCertificateRequest) -> (String, String) {
    (
        pcr.metadata.namespace.clone().unwrap_or_default(),
        pcr.metadata.name.clone().unwrap_or_default(),
    )
}

fn terminal(o: &Observed) -> bool {
    !matches!(o, Observed::Pending | Observed::Gone)
}

impl View {
    fn seen(pcr: &PodCertificateRequest, pods: &HashSet<String>) -> Option<Seen> {
        pods.contains(&pcr.spec.pod_uid).then(|| Seen {
            pod_uid: pcr.spec.pod_uid.clone(),
            observed: observe(pcr),
        })
    }

    fn begin_list(&mut self) {
        self.listing = Some(HashMap::new());
    }

    fn listed(&mut self, pcr: &PodCertificateRequest, pods: &HashSet<String>) {
        if let (Some(l), Some(s)) = (self.listing.as_mut(), Self::seen(pcr, pods)) {
            l.insert(pcr_key(pcr), s);
        }
    }

    /// The list is the new view; what turned terminal meanwhile wakes.
    fn list_done(&mut self) -> Vec<Woken> {
        let next = self.listing.take().unwrap_or_default();
        let woken = next
            .iter()
            .filter(|(k, s)| terminal(&s.observed) && self.requests.get(*k) != Some(*s))
            .map(|((ns, name), s)| (ns.clone(), name.clone(), s.pod_uid.clone()))
            .collect();
        self.requests = next;
        self.healthy = true;
        woken
    }

    /// An added or changed request; Some when it turned terminal (the
    /// creation of a pending request wakes nothing).
    fn applied(&mut self, pcr: &PodCertificateRequest, pods: &HashSet<String>) -> Option<Woken> {
        let s = Self::seen(pcr, pods)?;
        let key = pcr_key(pcr);
        let wake = terminal(&s.observed) && self.requests.get(&key) != Some(&s);
        let pod_uid = s.pod_uid.clone();
        self.requests.insert(key.clone(), s);
        wake.then_some((key.0, key.1, pod_uid))
    }

    fn deleted(&mut self, pcr: &PodCertificateRequest) {
        self.requests.remove(&pcr_key(pcr));
    }

    fn failed(&mut self) {
        self.healthy = false;
    }

    /// What the view says of a request, when it can be trusted.
    fn lookup(&self, namespace: &str, name: &str) -> Option<Observed> {
        if !self.healthy {
            return None;
        }
        self.requests
            .get(&(namespace.to_string(), name.to_string()))
            .map(|s| s.observed.clone())
    }
}

impl PodCerts {
    fn enabled(&self) -> bool {
        self.gate
            .get()
            .copied()
            .unwrap_or_else(|| features::default_of(FEATURE_GATE))
    }

    /// Whether a state waits on the request `namespace/name`.
    fn waits_on(store: &Store, namespace: &str, name: &str) -> bool {
        store.lock().iter().any(|(k, s)| {
            k.namespace == namespace
                && match s {
                    CredState::Wait { pcr, .. } => pcr == name,
                    CredState::WaitRefresh { refresh_pcr, .. } => refresh_pcr == name,
                    _ => false,
                }
        })
    }

    /// The watch's word on a request, if it runs and is healthy.
    fn watched(&self, namespace: &str, name: &str) -> Option<Observed> {
        self.tracked
            .lock()
            .watch
            .as_ref()
            .and_then(|w| w.view.lookup(namespace, name))
    }

    fn watch_healthy(&self) -> bool {
        self.tracked
            .lock()
            .watch
            .as_ref()
            .is_some_and(|w| w.view.healthy)
    }
}

/// Whether the pod has a podCertificate projected source.
fn has_pod_certificate_source(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .flat_map(|v| v.projected.iter())
        .flat_map(|p| p.sources.iter().flatten())
        .any(|s| s.pod_certificate.is_some())
}

/// What a request's conditions say (the first terminal condition wins, as
/// upstream's loop returns on it); `Gone` when the API server has no such
/// request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Observed {
    Pending,
    Gone,
    Denied {
        reason: String,
        message: String,
    },
    Failed {
        reason: String,
        message: String,
    },
    Issued {
        chain: Vec<u8>,
        begin_refresh_at: i64,
    },
}

fn observe(pcr: &PodCertificateRequest) -> Observed {
    let Some(status) = pcr.status.as_ref() else {
        return Observed::Pending;
    };
    for c in status.conditions.iter().flatten() {
        match c.type_.as_str() {
            "Denied" => {
                return Observed::Denied {
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                }
            }
            "Failed" => {
                return Observed::Failed {
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                }
            }
            "Issued" => {
                return Observed::Issued {
                    chain: status
                        .certificate_chain
                        .clone()
                        .unwrap_or_default()
                        .into_bytes(),
                    // Validation requires it on an issued request; a zero
                    // time (refresh at once) if a signer left it out.
                    begin_refresh_at: status
                        .begin_refresh_at
                        .as_ref()
                        .map_or(0, |t| t.0.as_second()),
                };
            }
            _ => {}
        }
    }
    Observed::Pending
}

/// What one step of the machine does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Create a request (initial, or a refresh while serving the current
    /// credentials).
    Create { refresh: bool },
    /// Look at the named request.
    Get(String),
    /// Answer from the state as it is.
    Answer,
}

/// The pure part of upstream handleProjection: what the state calls for
/// at `now`.
fn next_step(state: Option<&CredState>, now: i64) -> Step {
    match state {
        None => Step::Create { refresh: false },
        Some(CredState::Wait { pcr, .. }) => Step::Get(pcr.clone()),
        Some(CredState::WaitRefresh { refresh_pcr, .. }) => Step::Get(refresh_pcr.clone()),
        Some(CredState::Fresh {
            begin_refresh_at, ..
        }) if now >= *begin_refresh_at => Step::Create { refresh: true },
        Some(_) => Step::Answer,
    }
}

/// The state after its request was seen as `seen` at `now`; `jitter`
/// (seconds) is added to an issued certificate's beginRefreshAt. None is
/// credStateInitial: a request gone past its abandon time is made again
/// (a refresh request's loss keeps the current credentials, and a new
/// refresh request is made).
fn after_observed(state: CredState, seen: Observed, now: i64, jitter: i64) -> Option<CredState> {
    Some(match (state, seen) {
        (s, Observed::Pending) => s,
        (CredState::Wait { abandon_at, .. }, Observed::Gone) if now > abandon_at => return None,
        (
            CredState::WaitRefresh {
                private_key,
                chain,
                begin_refresh_at,
                abandon_at,
                ..
            },
            Observed::Gone,
        ) if now > abandon_at => CredState::Fresh {
            private_key,
            chain,
            begin_refresh_at,
        },
        // Not found before then: informer lag upstream; waiting still.
        (s, Observed::Gone) => s,
        (_, Observed::Denied { reason, message }) => CredState::Denied { reason, message },
        (_, Observed::Failed { reason, message }) => CredState::Failed { reason, message },
        (
            CredState::Wait { private_key, .. },
            Observed::Issued {
                chain,
                begin_refresh_at,
            },
        )
        | (
            CredState::WaitRefresh {
                refresh_key: private_key,
                ..
            },
            Observed::Issued {
                chain,
                begin_refresh_at,
            },
        ) => CredState::Fresh {
            private_key,
            chain,
            begin_refresh_at: begin_refresh_at.saturating_add(jitter),
        },
        (s, Observed::Issued { .. }) => s,
    })
}

/// Whether the state holds issued credentials (fresh, or waiting for a
/// refresh).
fn serves(state: &CredState) -> bool {
    matches!(
        state,
        CredState::Fresh { .. } | CredState::WaitRefresh { .. }
    )
}

/// getCredBundle of a state (None: credStateInitial), with when to look
/// again: at the refresh time, or after `poll` while a refresh request is
/// pending. Past the certificate's notAfter it is still served, as
/// upstream's (whose refresh keeps being tried).
fn answer(state: Option<&CredState>, now: i64, poll: i64) -> Result<Credentials, PodCertError> {
    match state {
        None | Some(CredState::Wait { .. }) => Err(PodCertError::NotIssued),
        Some(CredState::Denied { reason, message }) => Err(PodCertError::Denied {
            reason: reason.clone(),
            message: message.clone(),
        }),
        Some(CredState::Failed { reason, message }) => Err(PodCertError::Failed {
            reason: reason.clone(),
            message: message.clone(),
        }),
        Some(CredState::Fresh {
            private_key,
            chain,
            begin_refresh_at,
        }) => Ok(Credentials {
            private_key: private_key.clone(),
            chain: chain.clone(),
            recheck_at: (*begin_refresh_at).max(now + 1),
        }),
        Some(CredState::WaitRefresh {
            private_key, chain, ..
        }) => Ok(Credentials {
            private_key: private_key.clone(),
            chain: chain.clone(),
            recheck_at: now + poll,
        }),
    }
}

/// upstream jitterDuration, in whole seconds: uniform in [0, JITTER_MAX).
fn jitter() -> i64 {
    let mut b = [0u8; 8];
    // The system's random source does not fail on Linux; no jitter if it
    // did.
    if SystemRandom::new().fill(&mut b).is_err() {
        return 0;
    }
    (u64::from_le_bytes(b) % JITTER_MAX as u64) as i64
}

/// A key pair as the request carries it.
#[derive(Debug, Clone)]
pub struct GeneratedKey {
    /// PKCS#8 `PRIVATE KEY` PEM (Go's MarshalPKCS8PrivateKey + pem).
    pub private_key_pem: Vec<u8>,
    /// DER SubjectPublicKeyInfo (Go's MarshalPKIXPublicKey).
    pub pkix_public_key: Vec<u8>,
    /// The signature of the pod UID's bytes: ECDSA (ASN.1) over their
    /// SHA-256 digest (for P-384 and P-521 too), RSASSA-PSS over that
    /// digest, Ed25519 over the bytes themselves.
    pub proof_of_possession: Vec<u8>,
}

/// ring's system random source as the RNG the RustCrypto key generators
/// and signers take, so that every key type draws from the one source.
struct RingRng(SystemRandom);

impl rsa::rand_core::RngCore for RingRng {
    fn next_u32(&mut self) -> u32 {
        rsa::rand_core::impls::next_u32_via_fill(self)
    }

    fn next_u64(&mut self) -> u64 {
        rsa::rand_core::impls::next_u64_via_fill(self)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        // getrandom(2) does not fail on Linux; a key must never be made of
        // anything but its output (the blocking pool turns the panic into
        // a key generation error).
        self.0.fill(dest).expect("the system random source failed");
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rsa::rand_core::Error> {
        self.0.fill(dest).map_err(|_| {
            let code = std::num::NonZeroU32::new(rsa::rand_core::Error::CUSTOM_START)
                .expect("a non-zero code");
            rsa::rand_core::Error::from(code)
        })
    }
}

impl rsa::rand_core::CryptoRng for RingRng {}

/// SubjectPublicKeyInfo headers for the fixed-size keys: the algorithm
/// (and curve) and the BIT STRING of the key.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const P384_SPKI_PREFIX: [u8; 23] = [
    0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
    0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
];
/// Go's MarshalPKCS8PrivateKey of a P-384 key around the 48-byte scalar
/// and the 97-byte uncompressed point: version 0, ecPublicKey/secp384r1,
/// and an ECPrivateKey (version 1, the scalar, no parameters, [1] the
/// public key).
const P384_PKCS8_HEAD: [u8; 35] = [
    0x30, 0x81, 0xb6, 0x02, 0x01, 0x00, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02,
    0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22, 0x04, 0x81, 0x9e, 0x30, 0x81, 0x9b, 0x02, 0x01,
    0x01, 0x04, 0x30,
];
const P384_PKCS8_MID: [u8; 5] = [0xa1, 0x64, 0x03, 0x62, 0x00];
const P521_SPKI_PREFIX: [u8; 25] = [
    0x30, 0x81, 0x9b, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05,
    0x2b, 0x81, 0x04, 0x00, 0x23, 0x03, 0x81, 0x86, 0x00,
];
/// The same for a P-521 key (secp521r1), around the 66-byte scalar (Go
/// pads it to the order's size) and the 133-byte uncompressed point.
const P521_PKCS8_HEAD: [u8; 35] = [
    0x30, 0x81, 0xee, 0x02, 0x01, 0x00, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02,
    0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x23, 0x04, 0x81, 0xd6, 0x30, 0x81, 0xd3, 0x02, 0x01,
    0x01, 0x04, 0x42,
];
const P521_PKCS8_MID: [u8; 7] = [0xa1, 0x81, 0x89, 0x03, 0x81, 0x86, 0x00];
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// PKCS#8 v1 of an Ed25519 seed, as Go writes it (RFC 8410; no public key,
/// which Go's parser would not expect in a v1 document).
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// upstream generateKeyAndProof + pemEncodeKey + MarshalPKIXPublicKey.
pub fn generate_key_and_proof(key_type: &str, pod_uid: &str) -> Result<GeneratedKey, PodCertError> {
    let rng = SystemRandom::new();
    let gen_err = |what: &str| PodCertError::KeyGeneration(what.to_string());
    match key_type {
        "ECDSAP256" => {
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
                .map_err(|_| gen_err("while generating ECDSA P256 key"))?;
            let kp =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
                    .map_err(|_| gen_err("while generating ECDSA P256 key"))?;
            let sig = kp
                .sign(&rng, pod_uid.as_bytes())
                .map_err(|_| gen_err("while signing proof"))?;
            let mut spki = P256_SPKI_PREFIX.to_vec();
            spki.extend_from_slice(kp.public_key().as_ref());
            Ok(GeneratedKey {
                private_key_pem: pem_block("PRIVATE KEY", pkcs8.as_ref()),
                pkix_public_key: spki,
                proof_of_possession: sig.as_ref().to_vec(),
            })
        }
        "ED25519" => {
            let mut seed = [0u8; 32];
            rng.fill(&mut seed)
                .map_err(|_| gen_err("while generating Ed25519 key"))?;
            let kp = Ed25519KeyPair::from_seed_unchecked(&seed)
                .map_err(|_| gen_err("while generating Ed25519 key"))?;
            let sig = kp.sign(pod_uid.as_bytes());
            let mut spki = ED25519_SPKI_PREFIX.to_vec();
            spki.extend_from_slice(kp.public_key().as_ref());
            let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
            pkcs8.extend_from_slice(&seed);
            Ok(GeneratedKey {
                private_key_pem: pem_block("PRIVATE KEY", &pkcs8),
                pkix_public_key: spki,
                proof_of_possession: sig.as_ref().to_vec(),
            })
        }
        "ECDSAP384" => p384_key_and_proof(&rng, pod_uid),
        "ECDSAP521" => p521_key_and_proof(rng, pod_uid),
        "RSA3072" => rsa_key_and_proof(rng, 3072, pod_uid),
        "RSA4096" => rsa_key_and_proof(rng, 4096, pod_uid),
        other => Err(PodCertError::UnknownKeyType(other.to_string())),
    }
}

/// upstream's ECDSAP384 case: a P-384 key whose proof, like P-256's, is
/// `ecdsa.SignASN1` over the SHA-256 digest of the pod UID (the API server
/// checks it with `ecdsa.VerifyASN1(pub, sha256(uid))`, pkg/apis/
/// certificates/validation). ring's P-384 signer only hashes with SHA-384,
/// so the p384 crate signs the SHA-256 prehash (zero-padded on the left to
/// the field size, as Go's hashToInt reads a short digest).
fn p384_key_and_proof(rng: &SystemRandom, pod_uid: &str) -> Result<GeneratedKey, PodCertError> {
    use p384::ecdsa::signature::hazmat::PrehashSigner;
    let gen_err = || PodCertError::KeyGeneration("while generating ECDSA P384 key".into());
    // A uniformly random scalar: draws at or above the group order (or
    // zero) are rejected and drawn again, as Go's GenerateKey does.
    let mut key = None;
    for _ in 0..64 {
        let mut d = [0u8; 48];
        rng.fill(&mut d).map_err(|_| gen_err())?;
        if let Ok(k) = p384::ecdsa::SigningKey::from_slice(&d) {
            key = Some(k);
            break;
        }
    }
    let key = key.ok_or_else(gen_err)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, pod_uid.as_bytes());
    let sig: p384::ecdsa::Signature = key
        .sign_prehash(digest.as_ref())
        .map_err(|_| PodCertError::KeyGeneration("while signing proof".into()))?;
    let point = key.verifying_key().to_encoded_point(false);
    let (r, s) = sig.split_bytes();
    Ok(ec_generated(
        (&P384_SPKI_PREFIX, &P384_PKCS8_HEAD, &P384_PKCS8_MID),
        &key.to_bytes(),
        point.as_bytes(),
        (&r, &s),
    ))
}

/// An EC key as Go writes it: the SPKI (`spki` header, then the point) and
/// the PKCS#8 document (`head`, the scalar, `mid`, the point), with the
/// proof's r and s as ASN.1.
fn ec_generated(
    (spki_prefix, head, mid): (&[u8], &[u8], &[u8]),
    scalar: &[u8],
    point: &[u8],
    (r, s): (&[u8], &[u8]),
) -> GeneratedKey {
    let mut spki = spki_prefix.to_vec();
    spki.extend_from_slice(point);
    let mut pkcs8 = head.to_vec();
    pkcs8.extend_from_slice(scalar);
    pkcs8.extend_from_slice(mid);
    pkcs8.extend_from_slice(point);
    GeneratedKey {
        private_key_pem: pem_block("PRIVATE KEY", &pkcs8),
        pkix_public_key: spki,
        proof_of_possession: der_ecdsa_signature(r, s),
    }
}

/// upstream's ECDSAP521 case: as P-384, `ecdsa.SignASN1` over the SHA-256
/// digest of the pod UID. The p521 crate takes a prehash of at least half
/// the field (33 bytes), so the digest goes in zero-padded on the left to
/// the field's 66 bytes: the same integer, which Go's hashToInt takes
/// as is (a digest shorter than the order is not shifted).
fn p521_key_and_proof(rng: SystemRandom, pod_uid: &str) -> Result<GeneratedKey, PodCertError> {
    use p521::ecdsa::signature::hazmat::RandomizedPrehashSigner;
    let mut rng = RingRng(rng);
    // A uniformly random non-zero scalar, as Go's GenerateKey.
    let key = p521::ecdsa::SigningKey::random(&mut rng);
    let sig: p521::ecdsa::Signature = key
        .sign_prehash_with_rng(&mut rng, &p521_prehash(pod_uid))
        .map_err(|_| PodCertError::KeyGeneration("while signing proof".into()))?;
    // (SigningKey::verifying_key is behind a feature p521 0.13 lacks.)
    let point = p521::ecdsa::VerifyingKey::from(&key).to_encoded_point(false);
    let (r, s) = sig.split_bytes();
    Ok(ec_generated(
        (&P521_SPKI_PREFIX, &P521_PKCS8_HEAD, &P521_PKCS8_MID),
        &key.to_bytes(),
        point.as_bytes(),
        (&r, &s),
    ))
}

/// The SHA-256 digest of the pod UID as a P-521 prehash (see above).
fn p521_prehash(pod_uid: &str) -> [u8; 66] {
    let digest = ring::digest::digest(&ring::digest::SHA256, pod_uid.as_bytes());
    let mut z = [0u8; 66];
    z[66 - 32..].copy_from_slice(digest.as_ref());
    z
}

/// Go's PSSSaltLengthAuto when signing (crypto/rsa pss.go SignPSS): the
/// longest salt the modulus leaves room for beside a SHA-256 digest.
fn pss_max_salt_len(modulus_bits: usize) -> usize {
    (modulus_bits - 1).div_ceil(8) - 2 - 32
}

/// upstream's RSA3072 and RSA4096 cases: `rsa.GenerateKey` (e = 65537, two
/// primes, a modulus of exactly `bits` bits), the proof `rsa.SignPSS(rand,
/// key, SHA256, sha256(podUID), nil)`: nil options sign with the longest
/// salt, which the API server's `VerifyPSS(..., nil)` finds whatever its
/// length (pkg/apis/certificates/validation). The key is written as Go's
/// MarshalPKCS8PrivateKey writes it: rsaEncryption with NULL parameters
/// around the PKCS#1 RSAPrivateKey (version 0, n, e, d, p, q, the CRT
/// values); the public key as MarshalPKIXPublicKey.
fn rsa_key_and_proof(
    rng: SystemRandom,
    bits: usize,
    pod_uid: &str,
) -> Result<GeneratedKey, PodCertError> {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey};
    use rsa::traits::PublicKeyParts;
    let gen_err = || PodCertError::KeyGeneration(format!("while generating RSA {bits} key"));
    let mut rng = RingRng(rng);
    let key = rsa::RsaPrivateKey::new(&mut rng, bits).map_err(|_| gen_err())?;
    let digest = ring::digest::digest(&ring::digest::SHA256, pod_uid.as_bytes());
    // Blinded, as Go's private key operations are.
    let pss =
        rsa::pss::Pss::new_blinded_with_salt::<sha2::Sha256>(pss_max_salt_len(key.n().bits()));
    let proof = key
        .sign_with_rng(&mut rng, pss, digest.as_ref())
        .map_err(|_| PodCertError::KeyGeneration("while signing proof".into()))?;
    let pkcs8 = key.to_pkcs8_der().map_err(|_| gen_err())?;
    let spki = key
        .to_public_key()
        .to_public_key_der()
        .map_err(|_| gen_err())?;
    Ok(GeneratedKey {
        private_key_pem: pem_block("PRIVATE KEY", pkcs8.as_bytes()),
        pkix_public_key: spki.into_vec(),
        proof_of_possession: proof,
    })
}

/// An ECDSA signature as ASN.1 `SEQUENCE { r INTEGER, s INTEGER }` (what
/// Go's SignASN1 returns): minimal big-endian integers, a zero byte before
/// a high bit.
fn der_ecdsa_signature(r: &[u8], s: &[u8]) -> Vec<u8> {
    fn integer(out: &mut Vec<u8>, v: &[u8]) {
        let start = v.iter().position(|b| *b != 0).unwrap_or(v.len() - 1);
        let v = &v[start..];
        let pad = v[0] & 0x80 != 0;
        out.push(0x02);
        out.push((v.len() + usize::from(pad)) as u8);
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
    }
    let mut body = Vec::with_capacity(2 * 50);
    integer(&mut body, r);
    integer(&mut body, s);
    // At most 2 * (2 + 49) = 102 bytes: one length byte after 0x81 above
    // 127.
    let mut out = vec![0x30];
    if body.len() > 127 {
        out.push(0x81);
    }
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}

/// Go's pem.EncodeToMemory: base64 in 64-column lines.
fn pem_block(label: &str, der: &[u8]) -> Vec<u8> {
    let mut out = format!("-----BEGIN {label}-----\n").into_bytes();
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    for line in b64.as_bytes().chunks(64) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.extend_from_slice(format!("-----END {label}-----\n").as_bytes());
    out
}

/// The identities a request names, read from the pod and the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestIdentity {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub service_account_name: String,
    pub service_account_uid: String,
    pub node_name: String,
    pub node_uid: String,
}

/// upstream createPodCertificateRequest's object: generateName `req-`,
/// owned by the pod (so the garbage collector removes it with the pod).
pub fn build_request(
    id: &RequestIdentity,
    proj: &PodCertificateProjection,
    key: &GeneratedKey,
) -> PodCertificateRequest {
    PodCertificateRequest {
        metadata: ObjectMeta {
            namespace: Some(id.namespace.clone()),
            generate_name: Some("req-".into()),
            owner_references: Some(vec![OwnerReference {
                // Upstream writes "core/v1" here, literally.
                api_version: "core/v1".into(),
                kind: "Pod".into(),
                name: id.pod_name.clone(),
                uid: id.pod_uid.clone(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: PodCertificateRequestSpec {
            signer_name: proj.signer_name.clone(),
            pod_name: id.pod_name.clone(),
            pod_uid: id.pod_uid.clone(),
            service_account_name: id.service_account_name.clone(),
            service_account_uid: id.service_account_uid.clone(),
            node_name: id.node_name.clone(),
            node_uid: id.node_uid.clone(),
            max_expiration_seconds: proj.max_expiration_seconds,
            pkix_public_key: ByteString(key.pkix_public_key.clone()),
            proof_of_possession: ByteString(key.proof_of_possession.clone()),
        },
        status: None,
    }
}

impl ObjectManager {
    /// Sets the PodCertificateRequest feature gate (before pods come).
    pub fn with_pod_certificate_request(self, enabled: bool) -> Self {
        let _ = self.inner.pod_certs.gate.set(enabled);
        self
    }

    /// A pod entered the pod manager (upstream TrackPod): with the gate on,
    /// an API client and a podCertificate source, the watch of the node's
    /// requests runs while it is there.
    pub(super) fn track_pod_certificates(&self, pod: &Pod) {
        let pc = &self.inner.pod_certs;
        if !pc.enabled() || !has_pod_certificate_source(pod) {
            return;
        }
        let (Some((tasks, token)), Some(api)) = (self.inner.tasks.get(), self.api.get()) else {
            return;
        };
        // The pods come from the API source, which lists those bound to
        // this node: their nodeName is this node's name.
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if node.is_empty() {
            return;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut t = pc.tracked.lock();
        t.pods.insert(uid);
        if t.watch.is_some() {
            return;
        }
        t.epoch += 1;
        let epoch = t.epoch;
        let cancel = token.child_token();
        t.watch = Some(Running {
            epoch,
            cancel: cancel.clone(),
            view: View::default(),
        });
        drop(t);
        let (api, tracked, store) = (api.clone(), pc.tracked.clone(), pc.store.clone());
        let changes = self.inner.changes.get().cloned();
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = reflect_requests(api, node, epoch, tracked, store, changes) => {}
                }
            },
            tracing::info_span!("podcertificaterequest-watch"),
        ));
        info!("Started the watch of this node's PodCertificateRequests");
    }

    /// upstream ForgetPod: every projection of the pod, and what the watch
    /// kept of its requests; the watch stops with the last pod that has a
    /// podCertificate source.
    pub(super) fn forget_pod_certificates(&self, uid: &str) {
        let pc = &self.inner.pod_certs;
        pc.store.lock().retain(|k, _| k.pod_uid != uid);
        let stopped = {
            let mut t = pc.tracked.lock();
            t.pods.remove(uid);
            if let Some(w) = t.watch.as_mut() {
                w.view.requests.retain(|_, s| s.pod_uid != uid);
            }
            if t.pods.is_empty() {
                t.watch.take()
            } else {
                None
            }
        };
        if let Some(w) = stopped {
            w.cancel.cancel();
            info!("Stopped the watch of this node's PodCertificateRequests: no pod has a podCertificate source");
        }
    }

    /// Whether the watch of requests runs (tests and the debug view).
    pub fn pod_certificate_watch_running(&self) -> bool {
        self.inner.pod_certs.tracked.lock().watch.is_some()
    }

    /// The credentials of source `index` of the pod's projected volume
    /// `volume` (upstream GetPodCertificateCredentialBundle, after one step
    /// of handleProjection).
    pub async fn pod_certificate(
        &self,
        pod: &Pod,
        volume: &str,
        index: usize,
        proj: &PodCertificateProjection,
    ) -> Result<Credentials, PodCertError> {
        let pc = &self.inner.pod_certs;
        let Some(api) = self.api.get().filter(|_| pc.enabled()) else {
            return Err(PodCertError::Unsupported);
        };
        let key = ProjectionKey {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            pod_name: pod.metadata.name.clone().unwrap_or_default(),
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            volume: volume.to_string(),
            source_index: index,
        };
        let now = crate::kuberuntime::wall_now().as_secs() as i64;
        // The lock is never held across a call: one volume operation runs
        // per (pod, volume) at a time, so nothing else steps this key.
        let state = pc.store.lock().get(&key).cloned();
        let step = next_step(state.as_ref(), now);
        let stepped = self
            .step(api, pod, &key, proj, step, state.clone(), now)
            .await;
        let poll = if pc.watch_healthy() {
            REFRESH_PASS
        } else {
            REFRESH_POLL
        };
        let next = match stepped {
            Ok(next) => next,
            Err(e) if e.surfaced() && !state.as_ref().is_some_and(serves) => return Err(e),
            // Upstream logs a failed step and re-queues the projection; the
            // volume reads the state as it is (a refresh that failed keeps
            // the current credentials), tried again soon.
            Err(e) => {
                warn!(pod = %key.pod_name, namespace = %key.namespace, volume = %key.volume, source = index, error = %e, "while handling podCertificate projected volume source");
                return answer(state.as_ref(), now, poll).map(|c| Credentials {
                    recheck_at: now + REFRESH_POLL,
                    ..c
                });
            }
        };
        let out = answer(next.as_ref(), now, poll);
        let mut store = pc.store.lock();
        match next {
            Some(s) => store.insert(key, s),
            None => store.remove(&key),
        };
        out
    }

    /// One step of upstream handleProjection for `step`; None is
    /// credStateInitial.
    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        api: &ApiClient,
        pod: &Pod,
        key: &ProjectionKey,
        proj: &PodCertificateProjection,
        step: Step,
        state: Option<CredState>,
        now: i64,
    ) -> Result<Option<CredState>, PodCertError> {
        Ok(match (step, state) {
            (Step::Create { refresh }, state) => {
                let (private_key, name, created_at) =
                    self.create_request(api, pod, key, proj, refresh).await?;
                info!(pod = %key.pod_name, namespace = %key.namespace, volume = %key.volume, pcr = %name, refresh, "PodCertificateRequest created");
                let abandon_at = created_at + ASSUME_DELETED_AFTER + jitter();
                Some(match state {
                    Some(CredState::Fresh {
                        private_key: old_key,
                        chain,
                        begin_refresh_at,
                    }) => CredState::WaitRefresh {
                        private_key: old_key,
                        chain,
                        begin_refresh_at,
                        refresh_key: private_key,
                        refresh_pcr: name,
                        abandon_at,
                    },
                    _ => CredState::Wait {
                        private_key,
                        pcr: name,
                        abandon_at,
                    },
                })
            }
            (Step::Get(name), Some(state)) => {
                let seen = match self.inner.pod_certs.watched(&key.namespace, &name) {
                    Some(seen) => seen,
                    // The watch is down, or has not seen it yet: ask.
                    None => {
                        let client = api.client().await;
                        match Api::<PodCertificateRequest>::namespaced(client, &key.namespace)
                            .get(&name)
                            .await
                        {
                            Ok(got) => observe(&got),
                            Err(kube::Error::Api(s)) if s.code == 404 => Observed::Gone,
                            Err(e) => {
                                return Err(PodCertError::Get {
                                    name: format!("{}/{name}", key.namespace),
                                    message: e.to_string(),
                                })
                            }
                        }
                    }
                };
                debug!(pod = %key.pod_name, namespace = %key.namespace, volume = %key.volume, pcr = %name, ?seen, "PodCertificateRequest looked at");
                let gone = seen == Observed::Gone;
                let next = after_observed(state.clone(), seen, now, jitter());
                if !next.as_ref().is_some_and(|n| same_phase(n, &state)) {
                    log_transition(key, &name, gone, next.as_ref());
                }
                next
            }
            (_, state) => state,
        })
    }

    /// Creates a request; returns its key, name and creation time.
    async fn create_request(
        &self,
        api: &ApiClient,
        pod: &Pod,
        key: &ProjectionKey,
        proj: &PodCertificateProjection,
        refresh: bool,
    ) -> Result<(Vec<u8>, String, i64), PodCertError> {
        let which = if refresh { "refresh" } else { "initial" };
        let spec = pod.spec.as_ref();
        let sa_name = spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default();
        let node_name = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
        let client = api.client().await;
        // Upstream reads the account each time for its UID.
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), &key.namespace)
            .get(&sa_name)
            .await
            .map_err(|e| PodCertError::ServiceAccount(e.to_string()))?;
        // The pod's node is this node: the API source lists only pods bound
        // here, and the node authorizer lets a node ask only for those.
        let node = Api::<Node>::all(client.clone())
            .get(&node_name)
            .await
            .map_err(|e| PodCertError::Node(e.to_string()))?;
        let id = RequestIdentity {
            namespace: key.namespace.clone(),
            pod_name: key.pod_name.clone(),
            pod_uid: key.pod_uid.clone(),
            service_account_name: sa_name,
            service_account_uid: sa.metadata.uid.unwrap_or_default(),
            node_name,
            node_uid: node.metadata.uid.unwrap_or_default(),
        };
        // Key generation is CPU work, up to seconds for an RSA key (the
        // prime search): it runs on the blocking pool, not on the async
        // threads.
        let (key_type, pod_uid) = (proj.key_type.clone(), key.pod_uid.clone());
        let generated = crate::blocking::run(
            format!(
                "podcert-key/{}/{}/{}",
                key.pod_uid, key.volume, key.source_index
            ),
            KEYGEN_DEADLINE,
            move || generate_key_and_proof(&key_type, &pod_uid),
        )
        .await
        .map_err(keygen_failed)??;
        let req = build_request(&id, proj, &generated);
        let created = Api::<PodCertificateRequest>::namespaced(client, &key.namespace)
            .create(&PostParams::default(), &req)
            .await
            .map_err(|e| PodCertError::Create {
                which,
                message: e.to_string(),
            })?;
        let created_at = created.metadata.creation_timestamp.as_ref().map_or_else(
            || crate::kuberuntime::wall_now().as_secs() as i64,
            |t| t.0.as_second(),
        );
        Ok((
            generated.private_key_pem,
            created.metadata.name.unwrap_or_default(),
            created_at,
        ))
    }
}

/// The blocking pool's failure as the volume's key generation error (its
/// timeout text speaks of file systems, which this work has none of).
fn keygen_failed(e: crate::blocking::BlockingError) -> PodCertError {
    use crate::blocking::BlockingError;
    PodCertError::KeyGeneration(match e {
        BlockingError::Timeout { deadline, .. } => {
            format!("key generation did not finish within {deadline:?}")
        }
        BlockingError::StillStuck { .. } => {
            "an earlier key generation for this source has not finished".into()
        }
        BlockingError::Panicked { message, .. } => message,
    })
}

/// Whether two states are the same phase of the machine (no transition
/// to log).
fn same_phase(a: &CredState, b: &CredState) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// upstream's V(4) transition logs.
fn log_transition(key: &ProjectionKey, pcr: &str, gone: bool, next: Option<&CredState>) {
    let (pod, ns, vol) = (&key.pod_name, &key.namespace, &key.volume);
    match next {
        _ if gone => {
            warn!(pod = %pod, namespace = %ns, volume = %vol, pcr = %pcr, "PodCertificateRequest appears to have been deleted; a new one will be created")
        }
        Some(CredState::Fresh { .. }) => {
            debug!(pod = %pod, namespace = %ns, volume = %vol, pcr = %pcr, "PodCertificateRequest issued, moving to credStateFresh")
        }
        Some(CredState::Denied { .. }) => {
            debug!(pod = %pod, namespace = %ns, volume = %vol, pcr = %pcr, "PodCertificateRequest denied, moving to credStateDenied")
        }
        Some(CredState::Failed { .. }) => {
            debug!(pod = %pod, namespace = %ns, volume = %vol, pcr = %pcr, "PodCertificateRequest failed, moving to credStateFailed")
        }
        _ => {}
    }
}

/// Follows the node's PodCertificateRequests (`spec.nodeName=<node>`, all
/// namespaces, as upstream's informer): list, watch, re-list on 410 Gone,
/// retry with backoff. Keeps what the manager reads of the requests of
/// tracked pods, and announces on `changes` (kind KIND, name the pod UID)
/// each request a state waits on that turned issued, denied or failed.
async fn reflect_requests(
    api: ApiClient,
    node: String,
    epoch: u64,
    tracked: Arc<Mutex<Tracked>>,
    store: Store,
    changes: Option<broadcast::Sender<ObjectKey>>,
) {
    // Runs `f` on this watch's view (if it is still the running one) with
    // the tracked pods.
    let with_view = |f: &mut dyn FnMut(&mut View, &HashSet<String>)| {
        let mut t = tracked.lock();
        let t = &mut *t;
        if let Some(w) = t.watch.as_mut().filter(|w| w.epoch == epoch) {
            f(&mut w.view, &t.pods);
        }
    };
    let announce = |woken: Vec<Woken>| {
        for (ns, name, pod_uid) in woken {
            if !PodCerts::waits_on(&store, &ns, &name) {
                continue;
            }
            debug!(namespace = %ns, pcr = %name, pod_uid = %pod_uid, "PodCertificateRequest reached a terminal state; waking the pod's volumes");
            if let Some(c) = &changes {
                let _ = c.send(ObjectKey {
                    kind: KIND,
                    namespace: ns,
                    name: pod_uid,
                });
            }
        }
    };
    let mut generation = api.generation();
    loop {
        generation.borrow_and_update();
        let all: Api<PodCertificateRequest> = Api::all(api.client().await);
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .timeout(290);
        let mut stream = watcher(all, cfg).default_backoff().boxed();
        let follow = async {
            while let Some(ev) = stream.next().await {
                let mut woken = Vec::new();
                match ev {
                    Ok(watcher::Event::Init) => with_view(&mut |v, _| v.begin_list()),
                    Ok(watcher::Event::InitApply(o)) => with_view(&mut |v, p| v.listed(&o, p)),
                    Ok(watcher::Event::InitDone) => {
                        with_view(&mut |v, _| woken = v.list_done());
                    }
                    Ok(watcher::Event::Apply(o)) => {
                        with_view(&mut |v, p| woken.extend(v.applied(&o, p)));
                    }
                    Ok(watcher::Event::Delete(o)) => with_view(&mut |v, _| v.deleted(&o)),
                    Err(e) => {
                        warn!(error = %e, "watch of PodCertificateRequests failed; retrying with backoff (requests are read with a GET meanwhile)");
                        with_view(&mut |v, _| v.failed());
                    }
                }
                announce(woken);
            }
        };
        tokio::select! {
            _ = generation.changed() => {
                with_view(&mut |v, _| v.failed());
                continue;
            }
            _ = follow => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1alpha1::PodCertificateRequestStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ED25519};

    const UID: &str = "0b5c7f5e-1111-4222-8333-444455556666";

    fn pem_der(pem: &[u8], label: &str) -> Vec<u8> {
        let text = std::str::from_utf8(pem).unwrap();
        let begin = format!("-----BEGIN {label}-----\n");
        let end = format!("-----END {label}-----\n");
        assert!(text.starts_with(&begin) && text.ends_with(&end), "{text}");
        assert!(text.lines().all(|l| l.len() <= 64));
        let body: String = text[begin.len()..text.len() - end.len()].lines().collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    }

    #[test]
    fn ecdsa_p256_proof_signs_the_pod_uid_and_the_key_is_pkcs8() {
        let k = generate_key_and_proof("ECDSAP256", UID).unwrap();
        assert_eq!(k.pkix_public_key.len(), 91);
        assert_eq!(&k.pkix_public_key[..26], &P256_SPKI_PREFIX);
        // The SPKI parses as an EC P-256 key.
        use x509_parser::prelude::FromDer;
        let (rest, spki) =
            x509_parser::x509::SubjectPublicKeyInfo::from_der(&k.pkix_public_key).unwrap();
        assert!(rest.is_empty());
        assert_eq!(spki.algorithm.algorithm.to_id_string(), "1.2.840.10045.2.1");
        let point = spki.subject_public_key.data.to_vec();
        assert_eq!(point.len(), 65);
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &point)
            .verify(UID.as_bytes(), &k.proof_of_possession)
            .expect("proof verifies over the pod UID");
        // Not over anything else.
        assert!(UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &point)
            .verify(b"another-uid", &k.proof_of_possession)
            .is_err());
        // The PEM holds the PKCS#8 document of the same key.
        let der = pem_der(&k.private_key_pem, "PRIVATE KEY");
        let kp =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der, &SystemRandom::new())
                .unwrap();
        assert_eq!(kp.public_key().as_ref(), &point[..]);
        // A fresh key each time.
        let again = generate_key_and_proof("ECDSAP256", UID).unwrap();
        assert_ne!(again.pkix_public_key, k.pkix_public_key);
    }

    #[test]
    fn ed25519_proof_signs_the_pod_uid_and_the_key_is_pkcs8_v1() {
        let k = generate_key_and_proof("ED25519", UID).unwrap();
        assert_eq!(k.pkix_public_key.len(), 44);
        let public = &k.pkix_public_key[12..];
        UnparsedPublicKey::new(&ED25519, public)
            .verify(UID.as_bytes(), &k.proof_of_possession)
            .expect("proof verifies over the pod UID");
        assert!(UnparsedPublicKey::new(&ED25519, public)
            .verify(b"x", &k.proof_of_possession)
            .is_err());
        let der = pem_der(&k.private_key_pem, "PRIVATE KEY");
        assert_eq!(der.len(), 48);
        // ring reads a v1 document too; the seed gives the same public key.
        let kp = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).unwrap();
        assert_eq!(kp.public_key().as_ref(), public);
    }

    /// The uncompressed point of an EC SubjectPublicKeyInfo on `curve`
    /// (its OID), read by x509-parser.
    fn ec_spki_point(der: &[u8], curve: &str) -> Vec<u8> {
        use x509_parser::prelude::FromDer;
        let (rest, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(der).unwrap();
        assert!(rest.is_empty());
        assert_eq!(spki.algorithm.algorithm.to_id_string(), "1.2.840.10045.2.1");
        let oid = spki
            .algorithm
            .parameters
            .as_ref()
            .unwrap()
            .as_oid()
            .unwrap();
        assert_eq!(oid.to_id_string(), curve);
        let point = spki.subject_public_key.data.to_vec();
        assert_eq!(point[0], 4, "uncompressed");
        point
    }

    /// Upstream's ECDSAP384: the proof is ECDSA over SHA-256(pod UID),
    /// which ring's P-384/SHA-256 verifier (an implementation apart from
    /// the signer's) accepts; the SPKI is an EC key on secp384r1 and the
    /// PEM a PKCS#8 document ring reads back to the same public key.
    #[test]
    fn ecdsa_p384_proof_signs_the_sha256_of_the_pod_uid_and_the_key_is_pkcs8() {
        use ring::signature::ECDSA_P384_SHA384_ASN1_SIGNING;
        use ring::signature::{ECDSA_P384_SHA256_ASN1, ECDSA_P384_SHA384_ASN1};
        let k = generate_key_and_proof("ECDSAP384", UID).unwrap();
        assert_eq!(k.pkix_public_key.len(), 120);
        let point = ec_spki_point(&k.pkix_public_key, "1.3.132.0.34");
        assert_eq!(point.len(), 97);
        UnparsedPublicKey::new(&ECDSA_P384_SHA256_ASN1, &point)
            .verify(UID.as_bytes(), &k.proof_of_possession)
            .expect("proof verifies over SHA-256 of the pod UID");
        // Not over another UID, and not with SHA-384 (the digest matters).
        assert!(UnparsedPublicKey::new(&ECDSA_P384_SHA256_ASN1, &point)
            .verify(b"another-uid", &k.proof_of_possession)
            .is_err());
        assert!(UnparsedPublicKey::new(&ECDSA_P384_SHA384_ASN1, &point)
            .verify(UID.as_bytes(), &k.proof_of_possession)
            .is_err());
        let der = pem_der(&k.private_key_pem, "PRIVATE KEY");
        assert_eq!(der.len(), 185);
        let kp =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_ASN1_SIGNING, &der, &SystemRandom::new())
                .unwrap();
        assert_eq!(kp.public_key().as_ref(), &point[..]);
        let again = generate_key_and_proof("ECDSAP384", UID).unwrap();
        assert_ne!(again.pkix_public_key, k.pkix_public_key);
    }

    /// Go's SignASN1 output: minimal INTEGERs, a zero byte before a high
    /// bit, a long length form past 127 bytes.
    #[test]
    fn ecdsa_signatures_are_minimal_der() {
        let mut r = [0u8; 48];
        r[47] = 5;
        let s = [0xffu8; 48];
        let der = der_ecdsa_signature(&r, &s);
        assert_eq!(&der[..5], &[0x30, 3 + 51, 0x02, 0x01, 0x05]);
        assert_eq!(&der[5..8], &[0x02, 49, 0x00]);
        let big = der_ecdsa_signature(&[0x80; 66], &[0x80; 66]);
        assert_eq!(&big[..3], &[0x30, 0x81, 2 * 69]);
    }

    #[test]
    fn an_unknown_key_type_is_named_in_the_error() {
        assert_eq!(
            generate_key_and_proof("DSA", UID).unwrap_err().to_string(),
            "while generating keypair: unknown key type \"DSA\""
        );
    }

    /// Upstream's RSA3072 and RSA4096: the SPKI is an rsaEncryption key
    /// (NULL parameters) of exactly that many bits and e = 65537; the PEM
    /// is the PKCS#8 document Go writes, which ring's strict parser reads
    /// back to the same public key; the proof is RSASSA-PSS over SHA-256
    /// of the pod UID with Go's nil-options salt, the longest the modulus
    /// allows (a verifier expecting a digest-sized salt refuses it), and
    /// does not verify over another UID.
    #[test]
    fn rsa_keys_are_pkcs8_with_a_max_salt_pss_proof_over_the_sha256_of_the_pod_uid() {
        use rsa::traits::PublicKeyParts;
        use x509_parser::prelude::FromDer;
        use x509_parser::public_key::PublicKey;
        for (key_type, bits, spki_len, max_salt) in
            [("RSA3072", 3072, 422, 350), ("RSA4096", 4096, 550, 478)]
        {
            let k = generate_key_and_proof(key_type, UID).unwrap();
            assert_eq!(k.pkix_public_key.len(), spki_len, "{key_type}");
            let (rest, spki) =
                x509_parser::x509::SubjectPublicKeyInfo::from_der(&k.pkix_public_key).unwrap();
            assert!(rest.is_empty());
            assert_eq!(
                spki.algorithm.algorithm.to_id_string(),
                "1.2.840.113549.1.1.1"
            );
            assert_eq!(
                spki.algorithm.parameters.as_ref().map(|p| p.tag().0),
                Some(5),
                "NULL parameters"
            );
            let PublicKey::RSA(rsa_pub) = spki.parsed().unwrap() else {
                panic!("{key_type}: not an RSA key");
            };
            let modulus = rsa::BigUint::from_bytes_be(rsa_pub.modulus);
            assert_eq!(modulus.bits(), bits);
            assert_eq!(rsa_pub.try_exponent().unwrap(), 65537);
            // PKCS#8 v1: rsaEncryption, NULL, and the PKCS#1 key.
            let der = pem_der(&k.private_key_pem, "PRIVATE KEY");
            assert_eq!(
                &der[4..24],
                &[
                    0x02, 0x01, 0x00, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d,
                    0x01, 0x01, 0x01, 0x05, 0x00, 0x04, 0x82
                ]
            );
            let kp = ring::signature::RsaKeyPair::from_pkcs8(&der).unwrap();
            assert_eq!(
                kp.public().as_ref(),
                spki.subject_public_key.data.as_ref(),
                "the private key is the SPKI's"
            );
            assert_eq!(k.proof_of_possession.len(), bits / 8);
            let public = rsa::RsaPublicKey::new(modulus, 65537u32.into()).unwrap();
            assert_eq!(public.size(), bits / 8);
            let verify = |uid: &str, salt: usize| {
                let digest = ring::digest::digest(&ring::digest::SHA256, uid.as_bytes());
                public.verify(
                    rsa::pss::Pss::new_with_salt::<sha2::Sha256>(salt),
                    digest.as_ref(),
                    &k.proof_of_possession,
                )
            };
            assert_eq!(pss_max_salt_len(bits), max_salt);
            verify(UID, max_salt).expect("proof verifies over SHA-256 of the pod UID");
            assert!(verify(UID, 32).is_err(), "not a digest-sized salt");
            assert!(verify("another-uid", max_salt).is_err());
        }
    }

    /// An ASN.1 ECDSA signature's r and s, each left-padded to `n` bytes.
    fn ecdsa_r_s(der: &[u8], n: usize) -> (Vec<u8>, Vec<u8>) {
        let (_, seq) = x509_parser::der_parser::parse_der(der).unwrap();
        let ints = seq.as_sequence().unwrap();
        assert_eq!(ints.len(), 2);
        let pad = |o: &x509_parser::der_parser::ber::BerObject| {
            let v = o.as_slice().unwrap();
            let v = v.strip_prefix(&[0]).unwrap_or(v);
            let mut out = vec![0u8; n - v.len()];
            out.extend_from_slice(v);
            out
        };
        (pad(&ints[0]), pad(&ints[1]))
    }

    /// Upstream's ECDSAP521: the SPKI is an EC key on secp521r1; the PEM
    /// is Go's PKCS#8 (ecPublicKey/secp521r1 around an ECPrivateKey v1
    /// with the 66-byte scalar and the public point) whose scalar gives
    /// the SPKI's point; the proof is ECDSA over SHA-256 of the pod UID
    /// (not over SHA-512, the p521 crate's own digest, nor another UID).
    #[test]
    fn ecdsa_p521_proof_signs_the_sha256_of_the_pod_uid_and_the_key_is_pkcs8() {
        use p521::ecdsa::signature::hazmat::PrehashVerifier;
        use p521::ecdsa::signature::Verifier;
        let k = generate_key_and_proof("ECDSAP521", UID).unwrap();
        assert_eq!(k.pkix_public_key.len(), 158);
        let point = ec_spki_point(&k.pkix_public_key, "1.3.132.0.35");
        assert_eq!(point.len(), 133);
        let vk = p521::ecdsa::VerifyingKey::from_sec1_bytes(&point).unwrap();
        let (r, s) = ecdsa_r_s(&k.proof_of_possession, 66);
        let sig = p521::ecdsa::Signature::from_scalars(
            *p521::FieldBytes::from_slice(&r),
            *p521::FieldBytes::from_slice(&s),
        )
        .unwrap();
        vk.verify_prehash(&p521_prehash(UID), &sig)
            .expect("proof verifies over SHA-256 of the pod UID");
        assert!(vk
            .verify_prehash(&p521_prehash("another-uid"), &sig)
            .is_err());
        assert!(vk.verify(UID.as_bytes(), &sig).is_err(), "not over SHA-512");
        // The PKCS#8 document, read by the pkcs8 crate's DER parser.
        let der = pem_der(&k.private_key_pem, "PRIVATE KEY");
        assert_eq!(der.len(), 241);
        let info = rsa::pkcs8::PrivateKeyInfo::try_from(&der[..]).unwrap();
        assert_eq!(info.algorithm.oid.to_string(), "1.2.840.10045.2.1");
        assert_eq!(
            info.algorithm.parameters_oid().unwrap().to_string(),
            "1.3.132.0.35"
        );
        assert!(info.public_key.is_none(), "PKCS#8 v1, as Go writes");
        let (rest, ec) = x509_parser::der_parser::parse_der(info.private_key).unwrap();
        assert!(rest.is_empty());
        let ec = ec.as_sequence().unwrap();
        assert_eq!(ec.len(), 3, "version, key, [1] public key; no [0]");
        assert_eq!(ec[0].as_u32().unwrap(), 1);
        let d = ec[1].as_slice().unwrap();
        assert_eq!(d.len(), 66);
        let from_d = p521::ecdsa::SigningKey::from_slice(d).unwrap();
        assert_eq!(
            p521::ecdsa::VerifyingKey::from(&from_d)
                .to_encoded_point(false)
                .as_bytes(),
            &point[..]
        );
        assert_eq!(ec[2].tag().0, 1);
        let mut bits = vec![0x03, 0x81, 0x86, 0x00];
        bits.extend_from_slice(&point);
        assert_eq!(ec[2].as_slice().unwrap(), &bits[..]);
        let again = generate_key_and_proof("ECDSAP521", UID).unwrap();
        assert_ne!(again.pkix_public_key, k.pkix_public_key);
    }

    #[test]
    fn the_request_names_the_pod_account_node_and_key() {
        let id = RequestIdentity {
            namespace: "ns".into(),
            pod_name: "p".into(),
            pod_uid: UID.into(),
            service_account_name: "default".into(),
            service_account_uid: "sa-uid".into(),
            node_name: "n1".into(),
            node_uid: "node-uid".into(),
        };
        let proj = PodCertificateProjection {
            signer_name: "example.com/s".into(),
            key_type: "ED25519".into(),
            max_expiration_seconds: Some(3600),
            credential_bundle_path: Some("b.pem".into()),
            ..Default::default()
        };
        let key = generate_key_and_proof("ED25519", UID).unwrap();
        let r = build_request(&id, &proj, &key);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["apiVersion"], "certificates.k8s.io/v1alpha1");
        assert_eq!(v["kind"], "PodCertificateRequest");
        assert_eq!(v["metadata"]["generateName"], "req-");
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(
            v["metadata"]["ownerReferences"][0],
            serde_json::json!({"apiVersion": "core/v1", "kind": "Pod", "name": "p", "uid": UID})
        );
        let s = &v["spec"];
        assert_eq!(s["signerName"], "example.com/s");
        assert_eq!(s["podName"], "p");
        assert_eq!(s["podUID"], UID);
        assert_eq!(s["serviceAccountName"], "default");
        assert_eq!(s["serviceAccountUID"], "sa-uid");
        assert_eq!(s["nodeName"], "n1");
        assert_eq!(s["nodeUID"], "node-uid");
        assert_eq!(s["maxExpirationSeconds"], 3600);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        assert_eq!(s["pkixPublicKey"], b64(&key.pkix_public_key));
        assert_eq!(s["proofOfPossession"], b64(&key.proof_of_possession));
    }

    fn pcr(
        conds: &[(&str, &str, &str)],
        chain: Option<&str>,
        refresh: i64,
    ) -> PodCertificateRequest {
        let t = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        PodCertificateRequest {
            status: Some(PodCertificateRequestStatus {
                conditions: Some(
                    conds
                        .iter()
                        .map(|(ty, reason, message)| Condition {
                            type_: ty.to_string(),
                            status: "True".into(),
                            reason: reason.to_string(),
                            message: message.to_string(),
                            last_transition_time: t(1),
                            observed_generation: None,
                        })
                        .collect(),
                ),
                certificate_chain: chain.map(str::to_string),
                begin_refresh_at: Some(t(refresh)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn conditions_decide_denied_failed_issued_or_pending() {
        assert_eq!(
            observe(&PodCertificateRequest::default()),
            Observed::Pending
        );
        assert_eq!(observe(&pcr(&[], None, 0)), Observed::Pending);
        assert_eq!(
            observe(&pcr(&[("Denied", "NoWay", "not you")], None, 0)),
            Observed::Denied {
                reason: "NoWay".into(),
                message: "not you".into()
            }
        );
        assert_eq!(
            observe(&pcr(&[("Failed", "Broken", "oops")], None, 0)),
            Observed::Failed {
                reason: "Broken".into(),
                message: "oops".into()
            }
        );
        assert_eq!(
            observe(&pcr(&[("Issued", "Ok", "")], Some("CHAIN"), 500)),
            Observed::Issued {
                chain: b"CHAIN".to_vec(),
                begin_refresh_at: 500
            }
        );
        // A chain without the Issued condition is not issued.
        assert_eq!(observe(&pcr(&[], Some("CHAIN"), 500)), Observed::Pending);
        assert_eq!(
            PodCertError::Denied {
                reason: "NoWay".into(),
                message: "not you".into()
            }
            .to_string(),
            "PodCertificateRequest was permanently denied: reason=\"NoWay\" message=\"not you\""
        );
    }

    #[test]
    fn the_machine_waits_serves_refreshes_after_begin_refresh_at_and_keeps_the_old_meanwhile() {
        // Initial: create; nothing to serve yet.
        assert_eq!(next_step(None, 100), Step::Create { refresh: false });
        assert_eq!(answer(None, 100, 10), Err(PodCertError::NotIssued));
        let wait = CredState::Wait {
            private_key: b"K1".to_vec(),
            pcr: "req-a".into(),
            abandon_at: 700,
        };
        assert_eq!(next_step(Some(&wait), 100), Step::Get("req-a".into()));
        assert_eq!(answer(Some(&wait), 100, 10), Err(PodCertError::NotIssued));
        // Pending: still waiting.
        let still = after_observed(wait.clone(), Observed::Pending, 100, 0);
        assert_eq!(still.as_ref(), Some(&wait));
        // Issued: fresh with the waiting key, due again at beginRefreshAt
        // plus the jitter drawn then.
        let fresh = after_observed(
            wait,
            Observed::Issued {
                chain: b"C1".to_vec(),
                begin_refresh_at: 1000,
            },
            100,
            42,
        )
        .unwrap();
        let got = answer(Some(&fresh), 100, 10).unwrap();
        assert_eq!(
            (
                got.private_key.as_slice(),
                got.chain.as_slice(),
                got.recheck_at
            ),
            (&b"K1"[..], &b"C1"[..], 1042)
        );
        // Before that nothing happens; at it, a refresh request.
        assert_eq!(next_step(Some(&fresh), 1041), Step::Answer);
        assert_eq!(
            next_step(Some(&fresh), 1042),
            Step::Create { refresh: true }
        );
        let waiting = CredState::WaitRefresh {
            private_key: b"K1".to_vec(),
            chain: b"C1".to_vec(),
            begin_refresh_at: 1042,
            refresh_key: b"K2".to_vec(),
            refresh_pcr: "req-b".into(),
            abandon_at: 2000,
        };
        assert_eq!(next_step(Some(&waiting), 1043), Step::Get("req-b".into()));
        // While the refresh is pending the old credentials are served, and
        // looked at again after the poll given.
        let got = answer(Some(&waiting), 1043, REFRESH_POLL).unwrap();
        assert_eq!(got.private_key, b"K1");
        assert_eq!(got.recheck_at, 1043 + REFRESH_POLL);
        assert_eq!(
            answer(Some(&waiting), 1043, REFRESH_PASS)
                .unwrap()
                .recheck_at,
            1043 + REFRESH_PASS
        );
        // Issued: the new key with the new chain.
        let renewed = after_observed(
            waiting.clone(),
            Observed::Issued {
                chain: b"C2".to_vec(),
                begin_refresh_at: 5000,
            },
            1044,
            0,
        );
        let got = answer(renewed.as_ref(), 1044, 10).unwrap();
        assert_eq!(
            (got.private_key, got.chain, got.recheck_at),
            (b"K2".to_vec(), b"C2".to_vec(), 5000)
        );
        // A denied refresh ends it, as upstream (the old chain is dropped).
        let denied = after_observed(
            waiting,
            Observed::Denied {
                reason: "R".into(),
                message: "M".into(),
            },
            1044,
            0,
        )
        .unwrap();
        assert_eq!(next_step(Some(&denied), 5000), Step::Answer);
        assert!(matches!(
            answer(Some(&denied), 5000, 10),
            Err(PodCertError::Denied { .. })
        ));
        // A past refresh time never asks for a rewrite in the past, and a
        // certificate past its notAfter is still served (upstream keeps
        // serving it while the refresh is retried).
        let overdue = CredState::Fresh {
            private_key: b"K".to_vec(),
            chain: b"C".to_vec(),
            begin_refresh_at: 10,
        };
        assert_eq!(answer(Some(&overdue), 50, 10).unwrap().recheck_at, 51);
        assert_eq!(
            next_step(Some(&overdue), 50),
            Step::Create { refresh: true }
        );
    }

    /// upstream assumeDeletedThreshold: a request not found is waited for
    /// (informer lag) until its abandon time; after it, an initial request
    /// is made again, and a lost refresh request leaves the current
    /// credentials fresh, so a new refresh request is made.
    #[test]
    fn a_request_gone_past_its_abandon_time_is_made_again() {
        let wait = CredState::Wait {
            private_key: b"K1".to_vec(),
            pcr: "req-a".into(),
            abandon_at: 700,
        };
        assert_eq!(
            after_observed(wait.clone(), Observed::Gone, 700, 0),
            Some(wait.clone())
        );
        assert_eq!(after_observed(wait, Observed::Gone, 701, 0), None);
        let waiting = CredState::WaitRefresh {
            private_key: b"K1".to_vec(),
            chain: b"C1".to_vec(),
            begin_refresh_at: 1042,
            refresh_key: b"K2".to_vec(),
            refresh_pcr: "req-b".into(),
            abandon_at: 2000,
        };
        assert_eq!(
            after_observed(waiting.clone(), Observed::Gone, 1999, 0),
            Some(waiting.clone())
        );
        let back = after_observed(waiting, Observed::Gone, 2001, 0).unwrap();
        assert_eq!(
            back,
            CredState::Fresh {
                private_key: b"K1".to_vec(),
                chain: b"C1".to_vec(),
                begin_refresh_at: 1042,
            }
        );
        assert_eq!(next_step(Some(&back), 2001), Step::Create { refresh: true });
        // Terminal states do not care.
        let denied = CredState::Denied {
            reason: "R".into(),
            message: "M".into(),
        };
        assert_eq!(
            after_observed(denied.clone(), Observed::Gone, 1 << 40, 0),
            Some(denied)
        );
    }

    #[test]
    fn the_refresh_jitter_is_under_five_minutes_and_varies() {
        let drawn: HashSet<i64> = (0..200).map(|_| jitter()).collect();
        assert!(drawn.iter().all(|j| (0..JITTER_MAX).contains(j)));
        assert!(drawn.len() > 10, "{drawn:?}");
    }

    fn named_pcr(
        ns: &str,
        name: &str,
        pod_uid: &str,
        conds: &[(&str, &str, &str)],
    ) -> PodCertificateRequest {
        let mut p = pcr(conds, Some("CHAIN"), 500);
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.spec.pod_uid = pod_uid.into();
        p
    }

    /// The watch's view keeps what the machine reads of the requests of
    /// tracked pods only, trusts itself only once listed and until an
    /// error, and wakes on a request turning terminal (not on its pending
    /// creation, not twice for the same state).
    #[test]
    fn the_view_keeps_tracked_pods_requests_and_wakes_on_terminal_states() {
        let pods: HashSet<String> = ["p1".to_string()].into();
        let mut v = View::default();
        v.begin_list();
        v.listed(&named_pcr("ns", "a", "p1", &[]), &pods);
        v.listed(&named_pcr("ns", "x", "other", &[("Issued", "", "")]), &pods);
        v.listed(&named_pcr("ns", "b", "p1", &[("Issued", "", "")]), &pods);
        // Not yet listed: nothing is trusted.
        assert_eq!(v.lookup("ns", "a"), None);
        let woken = v.list_done();
        assert_eq!(woken, vec![("ns".into(), "b".into(), "p1".into())]);
        assert_eq!(v.lookup("ns", "a"), Some(Observed::Pending));
        assert_eq!(
            v.lookup("ns", "x"),
            None,
            "an untracked pod's request is not kept"
        );
        assert_eq!(v.requests.len(), 2);
        // A new pending request wakes nothing; its issuance does, once.
        assert_eq!(v.applied(&named_pcr("ns", "c", "p1", &[]), &pods), None);
        let issued = named_pcr("ns", "c", "p1", &[("Issued", "", "")]);
        assert_eq!(
            v.applied(&issued, &pods),
            Some(("ns".into(), "c".into(), "p1".into()))
        );
        assert_eq!(v.applied(&issued, &pods), None);
        assert!(matches!(v.lookup("ns", "c"), Some(Observed::Issued { .. })));
        let denied = named_pcr("ns", "a", "p1", &[("Denied", "R", "M")]);
        assert!(v.applied(&denied, &pods).is_some());
        // A re-list after an error: only what changed meanwhile wakes.
        v.failed();
        assert_eq!(v.lookup("ns", "c"), None, "not trusted after an error");
        v.begin_list();
        v.listed(&issued, &pods);
        v.listed(&denied, &pods);
        v.listed(&named_pcr("ns", "d", "p1", &[("Failed", "F", "")]), &pods);
        assert_eq!(v.list_done(), vec![("ns".into(), "d".into(), "p1".into())]);
        assert_eq!(v.lookup("ns", "b"), None, "gone from the list");
        v.deleted(&issued);
        assert_eq!(v.lookup("ns", "c"), None);
    }

    #[test]
    fn only_requests_a_state_waits_on_wake_the_volume() {
        let store: Store = Default::default();
        let key = |ns: &str, i: usize| ProjectionKey {
            namespace: ns.into(),
            pod_name: "p".into(),
            pod_uid: "u".into(),
            volume: "v".into(),
            source_index: i,
        };
        store.lock().insert(
            key("ns", 0),
            CredState::Wait {
                private_key: vec![],
                pcr: "req-a".into(),
                abandon_at: 0,
            },
        );
        store.lock().insert(
            key("ns", 1),
            CredState::WaitRefresh {
                private_key: vec![],
                chain: vec![],
                begin_refresh_at: 0,
                refresh_key: vec![],
                refresh_pcr: "req-b".into(),
                abandon_at: 0,
            },
        );
        assert!(PodCerts::waits_on(&store, "ns", "req-a"));
        assert!(PodCerts::waits_on(&store, "ns", "req-b"));
        assert!(!PodCerts::waits_on(&store, "other", "req-a"));
        assert!(!PodCerts::waits_on(&store, "ns", "req-old"));
    }

    #[tokio::test]
    async fn without_an_api_server_or_with_the_gate_off_it_is_the_noop_managers_error() {
        let pod = Pod::default();
        let proj = PodCertificateProjection::default();
        let m = ObjectManager::default().with_pod_certificate_request(true);
        assert_eq!(
            m.pod_certificate(&pod, "v", 0, &proj).await,
            Err(PodCertError::Unsupported)
        );
        let slot = std::sync::Arc::new(std::sync::OnceLock::new());
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let _ = slot.set(crate::apiclient::ApiClient::new(
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
            m.pod_certificate(&pod, "v", 0, &proj)
                .await
                .unwrap_err()
                .to_string(),
            "unimplemented"
        );
    }

    /// Static pods cannot name API data: a manifest with a podCertificate
    /// source is refused at decode, never reaching this manager.
    #[test]
    fn a_static_pod_with_a_pod_certificate_source_is_refused() {
        let yaml = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: s\nspec:\n  containers:\n  - name: c\n    image: busybox\n  volumes:\n  - name: cert\n    projected:\n      sources:\n      - podCertificate:\n          signerName: example.com/s\n          keyType: ED25519\n          credentialBundlePath: b.pem\n";
        let e = crate::source::static_pod::decode_static_pod(
            yaml,
            std::path::Path::new("/m/s.yaml"),
            "n1",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown source for projected volume \"cert\""),
            "{e}"
        );
    }

    fn unreachable_api() -> std::sync::Arc<std::sync::OnceLock<crate::apiclient::ApiClient>> {
        let slot = std::sync::Arc::new(std::sync::OnceLock::new());
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let _ = slot.set(crate::apiclient::ApiClient::new(
            kube::Client::try_from(cfg).unwrap(),
            50,
            100,
        ));
        slot
    }

    /// With the API server away, a due refresh keeps serving the current
    /// credentials (looked at again in REFRESH_POLL); a first issuance has
    /// nothing to serve: the volume reads upstream's "not issued yet" (the
    /// API's error is logged, as upstream's handleProjection errors are).
    #[tokio::test]
    async fn a_failed_refresh_keeps_the_current_credentials() {
        let m = ObjectManager::new(
            unreachable_api(),
            tokio_util::task::TaskTracker::new(),
            tokio_util::sync::CancellationToken::new(),
        )
        .with_pod_certificate_request(true);
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some(UID.into());
        let key = |i: usize| ProjectionKey {
            namespace: "ns".into(),
            pod_name: "p".into(),
            pod_uid: UID.into(),
            volume: "v".into(),
            source_index: i,
        };
        let proj = PodCertificateProjection {
            key_type: "ED25519".into(),
            ..Default::default()
        };
        m.inner.pod_certs.store.lock().insert(
            key(0),
            CredState::Fresh {
                private_key: b"K".to_vec(),
                chain: b"C".to_vec(),
                begin_refresh_at: 1,
            },
        );
        let before = crate::kuberuntime::wall_now().as_secs() as i64;
        let got = m.pod_certificate(&pod, "v", 0, &proj).await.unwrap();
        assert_eq!((got.private_key, got.chain), (b"K".to_vec(), b"C".to_vec()));
        assert!(got.recheck_at >= before + REFRESH_POLL);
        // The state is unchanged: the refresh is tried again.
        assert!(matches!(
            m.inner.pod_certs.store.lock().get(&key(0)),
            Some(CredState::Fresh { .. })
        ));
        // A first issuance: not issued yet, nothing stored.
        let e = m.pod_certificate(&pod, "v", 1, &proj).await.unwrap_err();
        assert_eq!(e, PodCertError::NotIssued);
        assert!(m.inner.pod_certs.store.lock().get(&key(1)).is_none());
        // A waiting source whose request cannot be read: still waiting.
        m.inner.pod_certs.store.lock().insert(
            key(2),
            CredState::Wait {
                private_key: b"K".to_vec(),
                pcr: "req-a".into(),
                abandon_at: 0,
            },
        );
        let e = m.pod_certificate(&pod, "v", 2, &proj).await.unwrap_err();
        assert_eq!(e, PodCertError::NotIssued);
        assert!(matches!(
            m.inner.pod_certs.store.lock().get(&key(2)),
            Some(CredState::Wait { .. })
        ));
    }

    /// rkubelet's own key generation failures are what the volume reports
    /// (upstream would have made the key); the API's are logged.
    #[tokio::test]
    async fn a_key_generation_failure_is_the_volumes_error() {
        let m = ObjectManager::new(
            unreachable_api(),
            tokio_util::task::TaskTracker::new(),
            tokio_util::sync::CancellationToken::new(),
        )
        .with_pod_certificate_request(true);
        let e = PodCertError::KeyGeneration("while generating RSA 3072 key".into());
        assert!(e.surfaced());
        assert!(!PodCertError::ServiceAccount("x".into()).surfaced());
        // The API is away: the account's GET fails first, logged; the
        // volume still says "not issued yet".
        let proj = PodCertificateProjection {
            key_type: "RSA3072".into(),
            ..Default::default()
        };
        let mut pod = Pod::default();
        pod.metadata.uid = Some(UID.into());
        assert_eq!(
            m.pod_certificate(&pod, "v", 0, &proj).await,
            Err(PodCertError::NotIssued)
        );
    }

    #[test]
    fn a_key_generation_that_fails_on_the_blocking_pool_says_so() {
        use crate::blocking::BlockingError;
        let e = keygen_failed(BlockingError::Timeout {
            what: "podcert-key/u/v/0".into(),
            deadline: KEYGEN_DEADLINE,
        });
        assert_eq!(
            e.to_string(),
            "while generating keypair: key generation did not finish within 120s"
        );
        assert!(e.surfaced());
        let e = keygen_failed(BlockingError::StillStuck {
            what: "podcert-key/u/v/0".into(),
        });
        assert!(e.to_string().contains("has not finished"), "{e}");
    }

    fn cert_pod(uid: &str, node: Option<&str>) -> Pod {
        use k8s_openapi::api::core::v1::{
            PodSpec, ProjectedVolumeSource, Volume, VolumeProjection,
        };
        let mut p = Pod {
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                volumes: Some(vec![Volume {
                    name: "cert".into(),
                    projected: Some(ProjectedVolumeSource {
                        sources: Some(vec![VolumeProjection {
                            pod_certificate: Some(PodCertificateProjection::default()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some(uid.into());
        p.metadata.namespace = Some("ns".into());
        p
    }

    /// The watch of the node's requests runs while a pod in the pod manager
    /// has a podCertificate source (gate on, API client), and stops with
    /// the last one; forgetting a pod drops its projections only.
    #[tokio::test]
    async fn the_watch_runs_while_a_pod_has_a_pod_certificate_source() {
        let tasks = tokio_util::task::TaskTracker::new();
        let token = tokio_util::sync::CancellationToken::new();
        let off = ObjectManager::new(unreachable_api(), tasks.clone(), token.clone());
        off.register_pod(&cert_pod("a", Some("n1")));
        assert!(!off.pod_certificate_watch_running(), "gate off");
        let m = ObjectManager::new(unreachable_api(), tasks.clone(), token.clone())
            .with_pod_certificate_request(true);
        m.register_pod(&Pod {
            metadata: ObjectMeta {
                uid: Some("plain".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        assert!(!m.pod_certificate_watch_running(), "no source");
        m.register_pod(&cert_pod("a", Some("n1")));
        assert!(m.pod_certificate_watch_running());
        m.register_pod(&cert_pod("b", Some("n1")));
        let k = |uid: &str| ProjectionKey {
            namespace: "ns".into(),
            pod_name: "p".into(),
            pod_uid: uid.into(),
            volume: "v".into(),
            source_index: 0,
        };
        let st = CredState::Wait {
            private_key: vec![],
            pcr: "r".into(),
            abandon_at: 0,
        };
        m.inner.pod_certs.store.lock().insert(k("a"), st.clone());
        m.inner.pod_certs.store.lock().insert(k("b"), st);
        m.unregister_pod("a");
        assert!(m.pod_certificate_watch_running(), "b still has one");
        let left: Vec<String> = m
            .inner
            .pod_certs
            .store
            .lock()
            .keys()
            .map(|k| k.pod_uid.clone())
            .collect();
        assert_eq!(left, vec!["b".to_string()]);
        m.unregister_pod("plain");
        assert!(m.pod_certificate_watch_running());
        m.unregister_pod("b");
        assert!(!m.pod_certificate_watch_running(), "stopped with the last");
        // The task ends once cancelled.
        tasks.close();
        tokio::time::timeout(std::time::Duration::from_secs(10), tasks.wait())
            .await
            .expect("the watch task ends");
    }
}
