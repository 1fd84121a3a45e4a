//! Pod certificates for `podCertificate` projected volume sources (upstream
//! `pkg/kubelet/podcertificate`, 1.34, gate `PodCertificateRequest`): per
//! (pod, volume, source) a private key the kubelet generates, a
//! `PodCertificateRequest` (certificates.k8s.io/v1alpha1) with a proof of
//! possession, and upstream's state machine (wait → fresh → waitrefresh,
//! denied and failed for good).
//!
//! Upstream drives the machine from a work queue fed by a
//! PodCertificateRequest informer; here the volume set-up steps it: a
//! failing set-up is retried with the volume manager's backoff, and a
//! served certificate asks for a rewrite at `beginRefreshAt` (and every
//! REFRESH_POLL while the refresh request is pending).

use std::collections::HashMap;

use base64::Engine;
use k8s_openapi::api::certificates::v1alpha1::{PodCertificateRequest, PodCertificateRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, PodCertificateProjection, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;
use parking_lot::Mutex;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tracing::{debug, info, warn};

use super::ObjectManager;

/// The kubelet's feature gate for the projection.
pub const FEATURE_GATE: &str = "PodCertificateRequest";
/// Its default in 1.34: alpha, off.
pub const FEATURE_GATE_DEFAULT: bool = false;

/// How often a pending refresh request is looked at again (upstream's
/// refresh pass re-queues every projection each minute, and the informer
/// wakes it at once; without an informer, a shorter poll).
const REFRESH_POLL: i64 = 10;

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
    /// A key type upstream generates but ring cannot (RSA; ECDSA P-384 and
    /// P-521 proofs sign a SHA-256 digest, which ring's P-384 signer does
    /// not offer).
    #[error("while generating keypair: key type {0:?} is not supported by rkubelet (ECDSAP256 and ED25519 are)")]
    UnsupportedKeyType(String),
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum CredState {
    Wait {
        private_key: Vec<u8>,
        pcr: String,
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
        begin_refresh_at: i64,
    },
    WaitRefresh {
        private_key: Vec<u8>,
        chain: Vec<u8>,
        refresh_key: Vec<u8>,
        refresh_pcr: String,
    },
}

/// The manager's state, kept in the object manager.
#[derive(Default)]
pub(super) struct PodCerts {
    gate: std::sync::OnceLock<bool>,
    store: Mutex<HashMap<ProjectionKey, CredState>>,
}

impl PodCerts {
    /// upstream ForgetPod: every projection of the pod.
    pub(super) fn forget(&self, uid: &str) {
        self.store.lock().retain(|k, _| k.pod_uid != uid);
    }
}

/// What a request's conditions say (the first terminal condition wins, as
/// upstream's loop returns on it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Observed {
    Pending,
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

/// The state after its request was seen as `seen`.
fn after_observed(state: CredState, seen: Observed) -> CredState {
    match (state, seen) {
        (s, Observed::Pending) => s,
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
            begin_refresh_at,
        },
        (s, Observed::Issued { .. }) => s,
    }
}

/// Whether the state holds issued credentials (fresh, or waiting for a
/// refresh).
fn serves(state: &CredState) -> bool {
    matches!(
        state,
        CredState::Fresh { .. } | CredState::WaitRefresh { .. }
    )
}

/// getCredBundle of a state, with when to look again.
fn answer(state: &CredState, now: i64) -> Result<Credentials, PodCertError> {
    match state {
        CredState::Wait { .. } => Err(PodCertError::NotIssued),
        CredState::Denied { reason, message } => Err(PodCertError::Denied {
            reason: reason.clone(),
            message: message.clone(),
        }),
        CredState::Failed { reason, message } => Err(PodCertError::Failed {
            reason: reason.clone(),
            message: message.clone(),
        }),
        CredState::Fresh {
            private_key,
            chain,
            begin_refresh_at,
        } => Ok(Credentials {
            private_key: private_key.clone(),
            chain: chain.clone(),
            recheck_at: (*begin_refresh_at).max(now + 1),
        }),
        CredState::WaitRefresh {
            private_key, chain, ..
        } => Ok(Credentials {
            private_key: private_key.clone(),
            chain: chain.clone(),
            recheck_at: now + REFRESH_POLL,
        }),
    }
}

/// A key pair as the request carries it.
#[derive(Debug, Clone)]
pub struct GeneratedKey {
    /// PKCS#8 `PRIVATE KEY` PEM (Go's MarshalPKCS8PrivateKey + pem).
    pub private_key_pem: Vec<u8>,
    /// DER SubjectPublicKeyInfo (Go's MarshalPKIXPublicKey).
    pub pkix_public_key: Vec<u8>,
    /// The signature of the pod UID's bytes: ECDSA (ASN.1) over their
    /// SHA-256 digest, Ed25519 over the bytes themselves.
    pub proof_of_possession: Vec<u8>,
}

/// SubjectPublicKeyInfo headers for the fixed-size keys: the algorithm
/// (and curve) and the BIT STRING of the key.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
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
        "RSA3072" | "RSA4096" | "ECDSAP384" | "ECDSAP521" => {
            Err(PodCertError::UnsupportedKeyType(key_type.to_string()))
        }
        other => Err(PodCertError::UnknownKeyType(other.to_string())),
    }
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
        let enabled = pc.gate.get().copied().unwrap_or(FEATURE_GATE_DEFAULT);
        let Some(api) = self.api.get().filter(|_| enabled) else {
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
        let stepped = self.step(api, pod, &key, proj, step, state.clone()).await;
        let next = match (stepped, state) {
            (Ok(next), _) => next,
            // A failed refresh leaves the current credentials served (upstream
            // re-queues the projection; its bundle stays readable).
            (Err(e), Some(prior)) if serves(&prior) => {
                warn!(pod = %key.pod_name, namespace = %key.namespace, volume = %key.volume, error = %e, "couldn't refresh a pod certificate; the current one stays");
                return answer(&prior, now).map(|c| Credentials {
                    recheck_at: now + REFRESH_POLL,
                    ..c
                });
            }
            (Err(e), _) => return Err(e),
        };
        let out = answer(&next, now);
        pc.store.lock().insert(key, next);
        out
    }

    /// One step of upstream handleProjection for `step`.
    async fn step(
        &self,
        api: &crate::apiclient::ApiClient,
        pod: &Pod,
        key: &ProjectionKey,
        proj: &PodCertificateProjection,
        step: Step,
        state: Option<CredState>,
    ) -> Result<CredState, PodCertError> {
        Ok(match (step, state) {
            (Step::Create { refresh }, state) => {
                let (private_key, name) = self.create_request(api, pod, key, proj, refresh).await?;
                info!(pod = %key.pod_name, namespace = %key.namespace, volume = %key.volume, pcr = %name, refresh, "PodCertificateRequest created");
                match state {
                    Some(CredState::Fresh {
                        private_key: old_key,
                        chain,
                        ..
                    }) => CredState::WaitRefresh {
                        private_key: old_key,
                        chain,
                        refresh_key: private_key,
                        refresh_pcr: name,
                    },
                    _ => CredState::Wait {
                        private_key,
                        pcr: name,
                    },
                }
            }
            (Step::Get(name), Some(state)) => {
                let client = api.client().await;
                let got = Api::<PodCertificateRequest>::namespaced(client, &key.namespace)
                    .get(&name)
                    .await
                    .map_err(|e| PodCertError::Get {
                        name: format!("{}/{name}", key.namespace),
                        message: e.to_string(),
                    })?;
                let seen = observe(&got);
                debug!(pod = %key.pod_name, namespace = %key.namespace, volume = %key.volume, pcr = %name, ?seen, "PodCertificateRequest looked at");
                after_observed(state, seen)
            }
            (_, Some(state)) => state,
            (_, None) => return Err(PodCertError::NotIssued),
        })
    }

    async fn create_request(
        &self,
        api: &crate::apiclient::ApiClient,
        pod: &Pod,
        key: &ProjectionKey,
        proj: &PodCertificateProjection,
        refresh: bool,
    ) -> Result<(Vec<u8>, String), PodCertError> {
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
        // Key generation is CPU work of a millisecond or so (no I/O).
        let generated = generate_key_and_proof(&proj.key_type, &key.pod_uid)?;
        let req = build_request(&id, proj, &generated);
        let created = Api::<PodCertificateRequest>::namespaced(client, &key.namespace)
            .create(&PostParams::default(), &req)
            .await
            .map_err(|e| PodCertError::Create {
                which,
                message: e.to_string(),
            })?;
        Ok((
            generated.private_key_pem,
            created.metadata.name.unwrap_or_default(),
        ))
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

    #[test]
    fn key_types_ring_cannot_make_are_named_in_the_error() {
        for t in ["RSA3072", "RSA4096", "ECDSAP384", "ECDSAP521"] {
            let e = generate_key_and_proof(t, UID).unwrap_err();
            assert_eq!(e, PodCertError::UnsupportedKeyType(t.into()));
            assert!(e.to_string().contains(t), "{e}");
        }
        assert_eq!(
            generate_key_and_proof("DSA", UID).unwrap_err().to_string(),
            "while generating keypair: unknown key type \"DSA\""
        );
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
    fn the_machine_waits_serves_refreshes_at_begin_refresh_at_and_keeps_the_old_meanwhile() {
        // Initial: create.
        assert_eq!(next_step(None, 100), Step::Create { refresh: false });
        let wait = CredState::Wait {
            private_key: b"K1".to_vec(),
            pcr: "req-a".into(),
        };
        assert_eq!(next_step(Some(&wait), 100), Step::Get("req-a".into()));
        assert_eq!(answer(&wait, 100), Err(PodCertError::NotIssued));
        // Pending: still waiting.
        let still = after_observed(wait.clone(), Observed::Pending);
        assert_eq!(still, wait);
        // Issued: fresh with the waiting key, due again at beginRefreshAt.
        let fresh = after_observed(
            wait,
            Observed::Issued {
                chain: b"C1".to_vec(),
                begin_refresh_at: 1000,
            },
        );
        let got = answer(&fresh, 100).unwrap();
        assert_eq!(
            (
                got.private_key.as_slice(),
                got.chain.as_slice(),
                got.recheck_at
            ),
            (&b"K1"[..], &b"C1"[..], 1000)
        );
        // Before beginRefreshAt nothing happens; at it, a refresh request.
        assert_eq!(next_step(Some(&fresh), 999), Step::Answer);
        assert_eq!(
            next_step(Some(&fresh), 1000),
            Step::Create { refresh: true }
        );
        let waiting = CredState::WaitRefresh {
            private_key: b"K1".to_vec(),
            chain: b"C1".to_vec(),
            refresh_key: b"K2".to_vec(),
            refresh_pcr: "req-b".into(),
        };
        assert_eq!(next_step(Some(&waiting), 1001), Step::Get("req-b".into()));
        // While the refresh is pending the old credentials are served, and
        // looked at again soon.
        let got = answer(&waiting, 1001).unwrap();
        assert_eq!(got.private_key, b"K1");
        assert_eq!(got.recheck_at, 1001 + REFRESH_POLL);
        // Issued: the new key with the new chain.
        let renewed = after_observed(
            waiting.clone(),
            Observed::Issued {
                chain: b"C2".to_vec(),
                begin_refresh_at: 2000,
            },
        );
        let got = answer(&renewed, 1002).unwrap();
        assert_eq!(
            (got.private_key, got.chain),
            (b"K2".to_vec(), b"C2".to_vec())
        );
        // A denied refresh ends it, as upstream (the old chain is dropped).
        let denied = after_observed(
            waiting,
            Observed::Denied {
                reason: "R".into(),
                message: "M".into(),
            },
        );
        assert_eq!(next_step(Some(&denied), 5000), Step::Answer);
        assert!(matches!(
            answer(&denied, 5000),
            Err(PodCertError::Denied { .. })
        ));
        // A past beginRefreshAt never asks for a rewrite in the past.
        let overdue = CredState::Fresh {
            private_key: vec![],
            chain: vec![],
            begin_refresh_at: 10,
        };
        assert_eq!(answer(&overdue, 50).unwrap().recheck_at, 51);
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

    /// With the API server away, a due refresh keeps serving the current
    /// credentials (looked at again in REFRESH_POLL); a first issuance has
    /// nothing to serve and fails.
    #[tokio::test]
    async fn a_failed_refresh_keeps_the_current_credentials() {
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
        // A first issuance: the API's error.
        let e = m.pod_certificate(&pod, "v", 1, &proj).await.unwrap_err();
        assert!(matches!(e, PodCertError::ServiceAccount(_)), "{e}");
        assert!(m.inner.pod_certs.store.lock().get(&key(1)).is_none());
    }

    #[test]
    fn forgetting_a_pod_drops_its_projections_only() {
        let pc = PodCerts::default();
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
        };
        pc.store.lock().insert(k("a"), st.clone());
        pc.store.lock().insert(k("b"), st);
        pc.forget("a");
        let left: Vec<String> = pc.store.lock().keys().map(|k| k.pod_uid.clone()).collect();
        assert_eq!(left, vec!["b".to_string()]);
    }
}
