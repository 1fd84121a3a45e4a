//! ClusterTrustBundles in the API server double (`certificates.k8s.io/v1beta1`
//! `clustertrustbundles`, cluster-scoped): the store serves them generically
//! (list, watch, get, create, update, delete, label selectors); this module
//! adds what upstream's registry and validation do for this kind
//! (`pkg/registry/certificates/clustertrustbundle`,
//! `pkg/apis/certificates/validation` ValidateClusterTrustBundle(Update)).
//! Not checked: the `attest` permission on the signer, the 1 MiB size limit,
//! PEM block headers.

use serde_json::Value;

use super::store::ApiError;

/// The field labels a ClusterTrustBundle field selector accepts
/// (AddFieldLabelConversionFunc in `pkg/apis/certificates/v1beta1`).
pub fn convert_field_label(label: &str) -> Result<String, String> {
    match label {
        "metadata.name" | "spec.signerName" => Ok(label.to_string()),
        _ => Err(format!("field label not supported: {label}")),
    }
}

fn invalid(name: &str, errs: &[String]) -> ApiError {
    let msg = if errs.len() == 1 {
        errs[0].clone()
    } else {
        format!("[{}]", errs.join(", "))
    };
    ApiError::new(
        422,
        "Invalid",
        format!("ClusterTrustBundle.certificates.k8s.io {name:?} is invalid: {msg}"),
    )
}

/// Create and update validation; `old` is the stored object on update.
pub fn validate(obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let bundle = obj
        .pointer("/spec/trustBundle")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut errs = Vec::new();
    // ValidateClusterTrustBundleName.
    if signer.is_empty() {
        if name.contains(':') {
            errs.push(format!(
                "metadata.name: Invalid value: {name:?}: ClusterTrustBundle without signer name must not have \":\" in its name"
            ));
        }
    } else {
        let prefix = format!("{}:", signer.replace('/', ":"));
        if !name.starts_with(&prefix) {
            errs.push(format!(
                "metadata.name: Invalid value: {name:?}: ClusterTrustBundle for signerName {signer} must be named with prefix {prefix}"
            ));
        }
    }
    let old_bundle = old.and_then(|o| o.pointer("/spec/trustBundle").and_then(Value::as_str));
    // An update that keeps the bundle does not parse it again.
    if old_bundle != Some(bundle) {
        errs.extend(trust_bundle_errors(bundle));
    }
    if let Some(o) = old {
        let was = o
            .pointer("/spec/signerName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if was != signer {
            errs.push(format!(
                "spec.signerName: Invalid value: {signer:?}: field is immutable"
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(invalid(name, &errs))
    }
}

/// validateTrustBundle: CERTIFICATE blocks of X.509 CA certificates, at
/// least one, none twice.
fn trust_bundle_errors(bundle: &str) -> Vec<String> {
    use x509_parser::pem::Pem;
    let bad = |why: String| format!("spec.trustBundle: Invalid value: \"<value omitted>\": {why}");
    let mut errs = Vec::new();
    let mut seen: Vec<(Vec<u8>, Vec<usize>)> = Vec::new();
    for (i, pem) in Pem::iter_from_buffer(bundle.as_bytes()).enumerate() {
        let Ok(pem) = pem else { break };
        if pem.label != "CERTIFICATE" {
            errs.push(bad(format!("entry {i} has bad block type: {}", pem.label)));
            continue;
        }
        let Ok(cert) = pem.parse_x509() else {
            errs.push(bad(format!("entry {i} does not parse as X.509")));
            continue;
        };
        if !cert.is_ca() {
            errs.push(bad(format!("entry {i} does not have the CA bit set")));
            continue;
        }
        match seen.iter_mut().find(|(d, _)| *d == pem.contents) {
            Some((_, at)) => at.push(i),
            None => seen.push((pem.contents.clone(), vec![i])),
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    if seen.is_empty() {
        errs.push(bad("at least one trust anchor must be provided".into()));
    }
    for (_, at) in seen.iter().filter(|(_, at)| at.len() > 1) {
        let list: Vec<String> = at.iter().map(|i| i.to_string()).collect();
        errs.push(bad(format!(
            "duplicate trust anchor (indices [{}])",
            list.join(" ")
        )));
    }
    errs
}

/// A self-signed CA certificate named `cn`, PEM, for tests to put in
/// bundles (the API server accepts only CA certificates).
pub fn ca_certificate_pem(cn: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).expect("certificate").pem()
}
