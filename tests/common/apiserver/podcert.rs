//! PodCertificateRequests in the API server double
//! (`certificates.k8s.io/v1alpha1` `podcertificaterequests`, namespaced,
//! with a `/status` subresource, as a 1.34 cluster serves them with the
//! PodCertificateRequest gate and runtime-config on): the store serves them
//! generically; this module adds upstream's create rules
//! (`pkg/registry/certificates/podcertificaterequest` PrepareForCreate
//! clears status; `pkg/apis/certificates/validation`
//! ValidatePodCertificateRequestCreate parses the key as
//! `x509.ParsePKIXPublicKey` and verifies the proof of possession:
//! Ed25519 over the pod UID's bytes; ECDSA (P-256, P-384, P-521) with
//! `ecdsa.VerifyASN1(pub, hashBytes(podUID))`, the SHA-256 digest whatever
//! the curve; RSA keys of 3072 or 4096 bits with `rsa.VerifyPSS(pub,
//! SHA256, hashBytes(podUID), proof, nil)`, whose nil options find the
//! salt length from the signature). Not checked: the size limits of the
//! two fields, the node restriction admission (pod bound to the requesting
//! node), signer-name and annotation rules.

use base64::Engine;
use p521::ecdsa::signature::hazmat::PrehashVerifier;
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P384_SHA256_ASN1, ED25519};
use serde_json::Value;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use super::store::ApiError;

/// The key algorithms and curves Go's ParsePKIXPublicKey knows; any other
/// is a parse error there ("unknown public key algorithm", "unsupported
/// elliptic curve").
const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const ED25519_OID: &str = "1.3.101.112";
const X25519_OID: &str = "1.3.101.110";
const DSA_OID: &str = "1.2.840.10040.4.1";
const P224: &str = "1.3.132.0.33";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";
const P521: &str = "1.3.132.0.35";

fn invalid(name: &str, msg: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("PodCertificateRequest.certificates.k8s.io {name:?} is invalid: {msg}"),
    )
}

/// The field labels list and watch accept (pkg/apis/certificates/v1alpha1
/// conversion.go, PodCertificateRequest's field label conversion func;
/// kubelets watch their own with `spec.nodeName`). `metadata.namespace` is
/// not among them.
pub fn convert_field_label(label: &str) -> Result<String, String> {
    match label {
        "metadata.name" | "spec.signerName" | "spec.podName" | "spec.nodeName" => {
            Ok(label.to_string())
        }
        _ => Err(format!("field label not supported: {label}")),
    }
}

/// PrepareForCreate: the status is the signer's, never the creator's.
pub fn prepare_for_create(obj: &mut Value) {
    obj["status"] = serde_json::json!({});
}

/// Create validation: the key must be one upstream accepts and the proof
/// of possession must verify with it.
pub fn validate_create(obj: &Value) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let field = |k: &str| -> Vec<u8> {
        obj.pointer(&format!("/spec/{k}"))
            .and_then(Value::as_str)
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .unwrap_or_default()
    };
    let pkix = field("pkixPublicKey");
    let proof = field("proofOfPossession");
    let uid = obj
        .pointer("/spec/podUID")
        .and_then(Value::as_str)
        .unwrap_or("");
    let digest = ring::digest::digest(&ring::digest::SHA256, uid.as_bytes());
    let bad_pkix = |value: &str, msg: &str| {
        invalid(
            name,
            &format!("spec.pkixPublicKey: Invalid value: \"{value}\": {msg}"),
        )
    };
    let not_pkix = || bad_pkix("<omitted>", "must be a valid PKIX-serialized public key");
    let check = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(invalid(name, "spec.proofOfPossession: Invalid value: \"<omitted>\": could not verify proof-of-possession signature"))
        }
    };
    let spki = match x509_parser::x509::SubjectPublicKeyInfo::from_der(&pkix) {
        Ok(([], spki)) => spki,
        _ => return Err(not_pkix()),
    };
    let key = spki.subject_public_key.data.as_ref();
    match spki.algorithm.algorithm.to_id_string().as_str() {
        ED25519_OID if key.len() == 32 => check(
            UnparsedPublicKey::new(&ED25519, key)
                .verify(uid.as_bytes(), &proof)
                .is_ok(),
        ),
        EC_PUBLIC_KEY => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string())
                .unwrap_or_default();
            // ring's verifiers take the message and hash it with SHA-256:
            // the digest upstream verifies over.
            match curve.as_str() {
                P256 => check(
                    UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, key)
                        .verify(uid.as_bytes(), &proof)
                        .is_ok(),
                ),
                P384 => check(
                    UnparsedPublicKey::new(&ECDSA_P384_SHA256_ASN1, key)
                        .verify(uid.as_bytes(), &proof)
                        .is_ok(),
                ),
                P521 => {
                    let vk =
                        p521::ecdsa::VerifyingKey::from_sec1_bytes(key).map_err(|_| not_pkix())?;
                    check(verify_p521_sha256(&vk, digest.as_ref(), &proof))
                }
                P224 => Err(bad_pkix(
                    "curve P-224",
                    "elliptic public keys must use curve P256 or P384",
                )),
                _ => Err(not_pkix()),
            }
        }
        RSA_ENCRYPTION => {
            let Ok(PublicKey::RSA(rsa)) = spki.parsed() else {
                return Err(not_pkix());
            };
            let n = x509_parser::num_bigint::BigUint::from_bytes_be(rsa.modulus);
            // Go's pub.Size() * 8: the modulus' length in whole bytes.
            let size_bits = n.bits().div_ceil(8) * 8;
            if size_bits != 3072 && size_bits != 4096 {
                return Err(bad_pkix(
                    &format!("{size_bits}-bit modulus"),
                    "RSA keys must have modulus size 3072 or 4096",
                ));
            }
            check(verify_pss_sha256_any_salt(
                &n,
                rsa.exponent,
                digest.as_ref(),
                &proof,
            ))
        }
        X25519_OID | DSA_OID => Err(bad_pkix(
            "<omitted>",
            "unknown public key type; supported types are Ed25519, ECDSA, and RSA",
        )),
        _ => Err(not_pkix()),
    }
}

/// `ecdsa.VerifyASN1` of a P-521 key over a SHA-256 digest: the signature
/// a DER SEQUENCE of two positive INTEGERs and nothing after it; the
/// digest, shorter than the order, is the integer it spells (Go's
/// hashToInt shifts only digests longer than the order), which the p521
/// crate takes as a prehash zero-padded to the field's 66 bytes.
fn verify_p521_sha256(vk: &p521::ecdsa::VerifyingKey, digest: &[u8], proof: &[u8]) -> bool {
    let Ok((rest, seq)) = x509_parser::der_parser::parse_der(proof) else {
        return false;
    };
    let Ok(ints) = seq.as_sequence() else {
        return false;
    };
    if !rest.is_empty() || ints.len() != 2 {
        return false;
    }
    let mut scalars = Vec::new();
    for i in ints {
        let Ok(v) = i.as_bigint() else {
            return false;
        };
        let Some(v) = v.to_biguint() else {
            return false;
        };
        let bytes = v.to_bytes_be();
        if bytes.len() > 66 {
            return false;
        }
        let mut padded = [0u8; 66];
        padded[66 - bytes.len()..].copy_from_slice(&bytes);
        scalars.push(padded);
    }
    let Ok(sig) = p521::ecdsa::Signature::from_scalars(
        *p521::FieldBytes::from_slice(&scalars[0]),
        *p521::FieldBytes::from_slice(&scalars[1]),
    ) else {
        return false;
    };
    let mut z = [0u8; 66];
    z[66 - digest.len()..].copy_from_slice(digest);
    vk.verify_prehash(&z, &sig).is_ok()
}

/// Go's `rsa.VerifyPSS(pub, crypto.SHA256, digest, sig, nil)` (crypto/rsa
/// pss.go): RFC 8017 EMSA-PSS-VERIFY with MGF1-SHA256, the salt length
/// found at the 0x01 separator (PSSSaltLengthAuto), so a signature with
/// any salt length verifies. Written here on num-bigint and ring's
/// SHA-256, apart from the rsa crate the kubelet signs with (ring's own
/// PSS verifier takes only a digest-sized salt).
fn verify_pss_sha256_any_salt(
    n: &x509_parser::num_bigint::BigUint,
    e: &[u8],
    digest: &[u8],
    sig: &[u8],
) -> bool {
    use x509_parser::num_bigint::BigUint;
    const H_LEN: usize = 32;
    let k = n.bits().div_ceil(8) as usize;
    let s = BigUint::from_bytes_be(sig);
    if sig.len() != k || &s >= n {
        return false;
    }
    let m = s.modpow(&BigUint::from_bytes_be(e), n).to_bytes_be();
    let em_bits = n.bits() as usize - 1;
    let em_len = em_bits.div_ceil(8);
    // The encoded message is em_len bytes; a longer one (a leading byte
    // where the modulus has only its top bit) is refused, as Go does.
    if m.len() > em_len || em_len < H_LEN + 2 {
        return false;
    }
    let mut em = vec![0u8; em_len - m.len()];
    em.extend_from_slice(&m);
    if em[em_len - 1] != 0xbc {
        return false;
    }
    let (masked_db, h) = em[..em_len - 1].split_at(em_len - H_LEN - 1);
    let top = 0xffu8 >> (8 * em_len - em_bits);
    if masked_db[0] & !top != 0 {
        return false;
    }
    // DB = maskedDB xor MGF1(H).
    let mut db = masked_db.to_vec();
    for (counter, chunk) in db.chunks_mut(H_LEN).enumerate() {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(h);
        ctx.update(&(counter as u32).to_be_bytes());
        for (b, m) in chunk.iter_mut().zip(ctx.finish().as_ref()) {
            *b ^= m;
        }
    }
    db[0] &= top;
    let Some(ps_len) = db.iter().position(|b| *b == 0x01) else {
        return false;
    };
    if db[..ps_len].iter().any(|b| *b != 0) {
        return false;
    }
    let salt = &db[ps_len + 1..];
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(&[0u8; 8]);
    ctx.update(digest);
    ctx.update(salt);
    ctx.finish().as_ref() == h
}
