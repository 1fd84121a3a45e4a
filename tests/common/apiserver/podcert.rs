//! PodCertificateRequests in the API server double
//! (`certificates.k8s.io/v1alpha1` `podcertificaterequests`, namespaced,
//! with a `/status` subresource, as a 1.34 cluster serves them with the
//! PodCertificateRequest gate and runtime-config on): the store serves them
//! generically; this module adds upstream's create rules
//! (`pkg/registry/certificates/podcertificaterequest` PrepareForCreate
//! clears status; `pkg/apis/certificates/validation`
//! ValidatePodCertificateRequestCreate verifies the proof of possession:
//! Ed25519 over the pod UID's bytes, ECDSA over their SHA-256 digest, for
//! P-384 keys too: `ecdsa.VerifyASN1(pub, hashBytes(podUID))` whatever the
//! curve). Not checked: RSA and P-521 proofs (accepted unverified), the
//! node restriction admission (pod bound to the requesting node),
//! signer-name and annotation rules.

use base64::Engine;
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P384_SHA256_ASN1, ED25519};
use serde_json::Value;

use super::store::ApiError;

/// SubjectPublicKeyInfo headers of a P-256, a P-384 and an Ed25519 key.
const P256_SPKI: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const P384_SPKI: [u8; 23] = [
    0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
    0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
];
const ED25519_SPKI: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

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

/// Create validation: the proof of possession must verify.
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
    let bad_proof = "spec.proofOfPossession: Invalid value: \"<omitted>\": could not verify proof-of-possession signature";
    let check = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(invalid(name, bad_proof))
        }
    };
    if pkix.len() == 91 && pkix.starts_with(&P256_SPKI) {
        return check(
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &pkix[26..])
                .verify(uid.as_bytes(), &proof)
                .is_ok(),
        );
    }
    if pkix.len() == 120 && pkix.starts_with(&P384_SPKI) {
        return check(
            UnparsedPublicKey::new(&ECDSA_P384_SHA256_ASN1, &pkix[23..])
                .verify(uid.as_bytes(), &proof)
                .is_ok(),
        );
    }
    if pkix.len() == 44 && pkix.starts_with(&ED25519_SPKI) {
        return check(
            UnparsedPublicKey::new(&ED25519, &pkix[12..])
                .verify(uid.as_bytes(), &proof)
                .is_ok(),
        );
    }
    if pkix.first() != Some(&0x30) {
        return Err(invalid(
            name,
            "spec.pkixPublicKey: Invalid value: \"<omitted>\": must be a valid PKIX-serialized public key",
        ));
    }
    Ok(())
}
