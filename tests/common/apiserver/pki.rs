//! The double's cluster CA: its serving certificate, client certificates for
//! tests, the CSR signer, and reading a client certificate's subject.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value;

pub struct Pki {
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
}

/// Sets a certificate's validity (rcgen takes `time::OffsetDateTime`).
fn set_validity(params: &mut CertificateParams, from: SystemTime, to: SystemTime) {
    let since = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since(from);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + since(to);
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Pki {
    pub fn new() -> Pki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "apiserver-double-ca");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        set_validity(
            &mut params,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(10 * 365 * 24 * 3600),
        );
        let cert = params.self_signed(&ca_key).expect("CA certificate");
        Pki {
            ca_pem: cert.pem(),
            ca_der: cert.der().clone(),
            ca_params: params,
            ca_key,
        }
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
    }

    fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.ca_params, &self.ca_key)
    }

    /// A new key and a certificate for it: subject CN + O, the given SANs
    /// and extended key usages, valid from `from` for `valid`.
    fn issue(
        &self,
        cn: &str,
        org: Option<&str>,
        sans: Vec<SanType>,
        ekus: Vec<ExtendedKeyUsagePurpose>,
        valid: Duration,
    ) -> (String, String, CertificateDer<'static>, KeyPair) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        if let Some(o) = org {
            dn.push(DnType::OrganizationName, o);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = sans;
        params.extended_key_usages = ekus;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = SystemTime::now();
        set_validity(&mut params, now - Duration::from_secs(60), now + valid);
        let cert = params.signed_by(&key, &self.issuer()).expect("certificate");
        (cert.pem(), key.serialize_pem(), cert.der().clone(), key)
    }

    /// A client certificate (CN = user, O = group) and its key, PEM.
    /// rcgen writes at most one O, so only the first of `orgs` is used.
    pub fn client_cert(&self, cn: &str, orgs: &[&str], valid: Duration) -> (String, String) {
        let (cert, key, _, _) = self.issue(
            cn,
            orgs.first().copied(),
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            valid,
        );
        (cert, key)
    }

    /// The API server's serving certificate chain and key, for 127.0.0.1 and
    /// localhost.
    pub fn serving(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let (_, _, der, key) = self.issue(
            "apiserver-double",
            None,
            vec![
                SanType::IpAddress([127, 0, 0, 1].into()),
                SanType::DnsName("localhost".try_into().expect("dns name")),
            ],
            vec![ExtendedKeyUsagePurpose::ServerAuth],
            Duration::from_secs(10 * 365 * 24 * 3600),
        );
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![der, self.ca_der()], key)
    }

    /// The signer: a certificate for a CSR object's `spec` (its `request`,
    /// `usages`, `expirationSeconds`, `signerName`), PEM.
    pub fn sign_csr(&self, spec: &Value, lifetime: Duration) -> Result<String, String> {
        let signer = spec["signerName"].as_str().unwrap_or("");
        let serving = match signer {
            "kubernetes.io/kube-apiserver-client-kubelet"
            | "kubernetes.io/kube-apiserver-client" => false,
            "kubernetes.io/kubelet-serving" => true,
            other => return Err(format!("the API server double does not sign for {other:?}")),
        };
        let request: k8s_openapi::ByteString =
            serde_json::from_value(spec["request"].clone()).map_err(err)?;
        let pem = String::from_utf8(request.0).map_err(err)?;
        let csr = CertificateSigningRequestParams::from_pem(&pem).map_err(err)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = csr.params.distinguished_name.clone();
        if serving {
            params.subject_alt_names = csr.params.subject_alt_names.clone();
        }
        let mut ekus = Vec::new();
        let mut kus = Vec::new();
        for u in spec["usages"].as_array().into_iter().flatten() {
            match u.as_str().unwrap_or("") {
                "client auth" => ekus.push(ExtendedKeyUsagePurpose::ClientAuth),
                "server auth" => ekus.push(ExtendedKeyUsagePurpose::ServerAuth),
                "digital signature" => kus.push(KeyUsagePurpose::DigitalSignature),
                "key encipherment" => kus.push(KeyUsagePurpose::KeyEncipherment),
                _ => {}
            }
        }
        params.extended_key_usages = ekus;
        params.key_usages = kus;
        let mut ttl = lifetime;
        if let Some(secs) = spec["expirationSeconds"].as_u64() {
            ttl = ttl.min(Duration::from_secs(secs));
        }
        // Upstream backdates certificates by 5 minutes against clock skew,
        // but not short-lived ones (under 8 h here).
        let now = SystemTime::now();
        let backdate = if ttl < Duration::from_secs(8 * 3600) {
            Duration::ZERO
        } else {
            Duration::from_secs(300)
        };
        set_validity(&mut params, now - backdate, now + ttl);
        let cert = params
            .signed_by(&csr.public_key, &self.issuer())
            .map_err(err)?;
        Ok(cert.pem())
    }
}

/// The user a client certificate names: CN, and the O entries as groups.
pub fn cert_identity(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}

/// The server's TLS config: its serving certificate, and client
/// certificates verified against the CA when given (anonymous allowed at
/// the TLS layer; the HTTP layer answers 401 when a user is required).
pub fn server_config(pki: &Pki) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der()).expect("CA root");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .expect("client verifier");
    let (chain, key) = pki.serving();
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("serving certificate");
    Arc::new(cfg)
}
