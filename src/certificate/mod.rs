//! TLS bootstrap of the kubelet's client certificate (upstream
//! `pkg/kubelet/certificate/bootstrap`): when `--kubeconfig` is missing or
//! its client certificate has expired, a key and a CSR for
//! `system:node:<node>` (group `system:nodes`, signer
//! `kubernetes.io/kube-apiserver-client-kubelet`) are sent with the
//! bootstrap credentials; once the CSR is approved and issued, the
//! certificate and key are written to `<cert-dir>/kubelet-client-<time>.pem`
//! behind the `kubelet-client-current.pem` symlink, and `--kubeconfig` is
//! written to use it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const CURRENT_CLIENT_PEM: &str = "kubelet-client-current.pem";
/// The pending key, kept across restarts so a CSR already sent stays usable.
const PENDING_KEY: &str = "kubelet-client.key.tmp";
/// Upstream waits this long for the CSR to be approved and issued.
const ISSUE_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bootstrap kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("bootstrap kubeconfig {}: {message}", path.display())]
    BadKubeconfig { path: PathBuf, message: String },
    #[error("key or CSR: {0}")]
    Key(#[from] rcgen::Error),
    #[error("API: {0}")]
    Api(#[from] kube::Error),
    #[error("the certificate signing request {name} was {state}: {message}")]
    Refused {
        name: String,
        state: String,
        message: String,
    },
    #[error("timed out waiting for the certificate signing request {0} to be issued")]
    Timeout(String),
    #[error("the issued certificate cannot be parsed: {0}")]
    BadCertificate(String),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CertError {
    let path = path.to_path_buf();
    move |source| CertError::Io { what, path, source }
}

/// The notAfter of the first certificate in `pem`, as seconds since the epoch.
pub fn not_after(pem: &[u8]) -> Result<i64, CertError> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| CertError::BadCertificate(e.to_string()))?;
    let cert = p
        .parse_x509()
        .map_err(|e| CertError::BadCertificate(e.to_string()))?;
    Ok(cert.validity().not_after.timestamp())
}

/// The notBefore and notAfter of the first certificate in `pem`.
pub fn validity(pem: &[u8]) -> Result<(i64, i64), CertError> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| CertError::BadCertificate(e.to_string()))?;
    let cert = p
        .parse_x509()
        .map_err(|e| CertError::BadCertificate(e.to_string()))?;
    let v = cert.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Whether the kubeconfig at `path` can be used as it is (upstream
/// isClientConfigStillValid): it loads, and a client certificate it names
/// has not expired. Credentials other than a certificate count as valid.
pub fn kubeconfig_still_valid(path: &Path) -> bool {
    let pem = match kubeconfig_client_cert(path) {
        Err(()) => return false,
        Ok(None) => return true,
        Ok(Some(pem)) => pem,
    };
    match not_after(&pem) {
        Ok(t) if t > now_secs() => true,
        Ok(_) => {
            warn!(kubeconfig = %path.display(), "the client certificate of the kubeconfig has expired");
            false
        }
        Err(e) => {
            warn!(kubeconfig = %path.display(), error = %e, "unable to read the client certificate of the kubeconfig");
            false
        }
    }
}

/// The client certificate PEM the kubeconfig at `path` names (inline or
/// as a file, relative to the kubeconfig); `Ok(None)` when it uses other
/// credentials, `Err` when it or the certificate cannot be read (blocking).
fn kubeconfig_client_cert(path: &Path) -> Result<Option<Vec<u8>>, ()> {
    let Ok(kc) = kube::config::Kubeconfig::read_from(path) else {
        return Err(());
    };
    let ctx_name = kc.current_context.clone().unwrap_or_default();
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone());
    let Some(auth) = kc
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == user.as_ref())
        .and_then(|a| a.auth_info.as_ref())
    else {
        return Err(());
    };
    if let Some(data) = &auth.client_certificate_data {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map(Some)
            .map_err(drop)
    } else if let Some(file) = &auth.client_certificate {
        let file = Path::new(file);
        let file = if file.is_relative() {
            path.parent().unwrap_or(Path::new("/")).join(file)
        } else {
            file.to_path_buf()
        };
        std::fs::read(&file).map(Some).map_err(drop)
    } else {
        Ok(None)
    }
}

/// The notAfter of the client certificate the kubelet uses, for
/// `kubelet_certificate_manager_client_ttl_seconds`: as upstream's client
/// certificate store, `<cert-dir>/kubelet-client-current.pem` first, else
/// the kubeconfig's own; `None` without one (read off the async threads).
pub async fn client_cert_not_after(kubeconfig: &Path, cert_dir: &Path) -> Option<i64> {
    let (kc, current) = (kubeconfig.to_path_buf(), cert_dir.join(CURRENT_CLIENT_PEM));
    tokio::task::spawn_blocking(move || {
        let pem = match std::fs::read(&current) {
            Ok(p) => p,
            Err(_) => kubeconfig_client_cert(&kc).ok()??,
        };
        not_after(&pem).ok()
    })
    .await
    .ok()?
}

/// Upstream's certificate file name time format (2006-01-02-15-04-05), UTC.
fn stamp() -> String {
    let ts = k8s_openapi::jiff::Timestamp::now();
    ts.strftime("%Y-%m-%d-%H-%M-%S").to_string()
}

/// Writes `cert` and `key` as one PEM file in `dir` and points the
/// `kubelet-client-current.pem` symlink at it (replaced atomically).
pub async fn store_client_pair(dir: &Path, cert: &str, key: &str) -> Result<PathBuf, CertError> {
    store_pair(dir, "kubelet-client", cert, key).await
}

/// `<dir>/<prefix>-<time>.pem` holding `cert` then `key`, behind the
/// `<prefix>-current.pem` symlink (upstream's certificate store layout).
async fn store_pair(dir: &Path, prefix: &str, cert: &str, key: &str) -> Result<PathBuf, CertError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(io("creating", dir))?;
    let file = dir.join(format!("{prefix}-{}.pem", stamp()));
    let body = format!("{}\n{}", cert.trim_end(), key);
    write_private(&file, body.into_bytes()).await?;
    let current = dir.join(format!("{prefix}-current.pem"));
    let tmp = dir.join(format!(".{prefix}-current.pem.tmp"));
    let _ = tokio::fs::remove_file(&tmp).await;
    tokio::fs::symlink(&file, &tmp)
        .await
        .map_err(io("linking", &tmp))?;
    tokio::fs::rename(&tmp, &current)
        .await
        .map_err(io("renaming", &current))?;
    Ok(current)
}

async fn write_private(path: &Path, body: Vec<u8>) -> Result<(), CertError> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)?;
        f.write_all(&body)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .and_then(|r| r)
    .map_err(io("writing", path))
}

/// The kubeconfig the kubelet writes after bootstrap: the bootstrap file's
/// cluster, with the client certificate and key in `pem`.
pub fn client_kubeconfig(
    bootstrap: &kube::config::Kubeconfig,
    pem: &Path,
) -> Result<String, String> {
    let ctx_name = bootstrap.current_context.clone().unwrap_or_default();
    let cluster_name = bootstrap
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or("no current context")?;
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or("the current context's cluster is missing")?;
    let mut c = serde_json::Map::new();
    c.insert(
        "server".into(),
        cluster.server.clone().unwrap_or_default().into(),
    );
    if let Some(d) = &cluster.certificate_authority_data {
        c.insert("certificate-authority-data".into(), d.clone().into());
    }
    if let Some(f) = &cluster.certificate_authority {
        c.insert("certificate-authority".into(), f.clone().into());
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        c.insert("insecure-skip-tls-verify".into(), true.into());
    }
    let pem = pem.display().to_string();
    let v = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": c}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "preferences": {},
        "users": [{"name": "default-auth", "user": {
            "client-certificate": pem, "client-key": pem}}],
    });
    crate::yaml::to_string(&v).map_err(|e| e.to_string())
}

/// Makes sure `kubeconfig` holds valid client credentials, bootstrapping
/// them through a CSR with the `bootstrap` kubeconfig if needed (upstream
/// LoadClientCert).
pub async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert_dir: &Path,
    node_name: &str,
) -> Result<(), CertError> {
    if kubeconfig_still_valid(kubeconfig) {
        info!(kubeconfig = %kubeconfig.display(), "using the existing kubeconfig");
        return Ok(());
    }
    info!(bootstrap = %bootstrap.display(), "using the bootstrap kubeconfig to request a client certificate");
    let kc_err = |source| CertError::Kubeconfig {
        path: bootstrap.to_path_buf(),
        source,
    };
    let bkc = kube::config::Kubeconfig::read_from(bootstrap).map_err(kc_err)?;
    let config = kube::Config::from_custom_kubeconfig(bkc.clone(), &Default::default())
        .await
        .map_err(kc_err)?;
    crate::metrics::transport::client_built(&config);
    let client = kube::Client::try_from(config)?;

    tokio::fs::create_dir_all(cert_dir)
        .await
        .map_err(io("creating", cert_dir))?;
    let key_path = cert_dir.join(PENDING_KEY);
    let key = match tokio::fs::read_to_string(&key_path).await {
        Ok(pem) => rcgen::KeyPair::from_pem(&pem)?,
        Err(_) => {
            let k = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
            write_private(&key_path, k.serialize_pem().into_bytes()).await?;
            k
        }
    };
    let cert = request_certificate(client, &key, node_name).await?;
    let current = store_client_pair(cert_dir, &cert, &key.serialize_pem()).await?;
    let text = client_kubeconfig(&bkc, &current).map_err(|message| CertError::BadKubeconfig {
        path: bootstrap.to_path_buf(),
        message,
    })?;
    if let Some(dir) = kubeconfig.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(io("creating", dir))?;
    }
    write_private(kubeconfig, text.into_bytes()).await?;
    let _ = tokio::fs::remove_file(&key_path).await;
    info!(kubeconfig = %kubeconfig.display(), cert = %current.display(), "client certificate issued and kubeconfig written");
    Ok(())
}

/// Sends a CSR for `key` and waits until it is issued; returns the
/// certificate PEM.
pub async fn request_certificate(
    client: kube::Client,
    key: &rcgen::KeyPair,
    node_name: &str,
) -> Result<String, CertError> {
    request_for(client, key, node_name, CLIENT_SIGNER, "client auth", &[]).await
}

/// Sends a CSR for `system:node:<node>` to `signer` with the usages
/// digital signature + `usage` and the given subject alternative names,
/// and waits until it is issued; returns the certificate PEM.
async fn request_for(
    client: kube::Client,
    key: &rcgen::KeyPair,
    node_name: &str,
    signer: &str,
    usage: &str,
    sans: &[rcgen::SanType],
) -> Result<String, CertError> {
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = sans.to_vec();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    params.distinguished_name = dn;
    let csr_pem = params.serialize_request(key)?.pem()?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: signer.into(),
            // Upstream, for ECDSA keys: digital signature and client or
            // server auth (no key encipherment).
            usages: Some(vec!["digital signature".into(), usage.into()]),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let created = api.create(&PostParams::default(), &csr).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    info!(csr = %name, "waiting for the client certificate to be issued");
    let issued = |c: Option<&CertificateSigningRequest>| {
        c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
            s.certificate.as_ref().is_some_and(|b| !b.0.is_empty())
                || s.conditions
                    .iter()
                    .flatten()
                    .any(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        })
    };
    let done = tokio::time::timeout(
        ISSUE_TIMEOUT,
        kube::runtime::wait::await_condition(api, &name, issued),
    )
    .await
    .map_err(|_| CertError::Timeout(name.clone()))?
    .map_err(|e| CertError::Refused {
        name: name.clone(),
        state: "not watchable".into(),
        message: e.to_string(),
    })?;
    let status = done.and_then(|c| c.status).unwrap_or_default();
    if let Some(c) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
    {
        return Err(CertError::Refused {
            name,
            state: c.type_.to_lowercase(),
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let cert = status.certificate.map(|b| b.0).unwrap_or_default();
    String::from_utf8(cert).map_err(|e| CertError::BadCertificate(e.to_string()))
}

pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// The serving certificate's subject alternative names: the node's
/// hostname and addresses.
fn serving_sans(hostname: &str, ips: &[std::net::IpAddr]) -> Vec<rcgen::SanType> {
    let mut sans = Vec::new();
    if let Ok(name) = hostname.to_string().try_into() {
        sans.push(rcgen::SanType::DnsName(name));
    }
    sans.extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    sans
}

/// Upstream's default serving certificate when `tlsCertFile` is not set:
/// `<cert-dir>/kubelet.crt` and `kubelet.key`, self-signed through a CA of
/// its own (`<host>-ca@<time>`), kept once written. Returns the two paths.
pub async fn ensure_self_signed_serving(
    cert_dir: &Path,
    hostname: &str,
    ips: &[std::net::IpAddr],
) -> Result<(PathBuf, PathBuf), CertError> {
    let (crt, key) = (cert_dir.join("kubelet.crt"), cert_dir.join("kubelet.key"));
    if tokio::fs::metadata(&crt).await.is_ok() && tokio::fs::metadata(&key).await.is_ok() {
        return Ok((crt, key));
    }
    tokio::fs::create_dir_all(cert_dir)
        .await
        .map_err(io("creating", cert_dir))?;
    let stamp = now_secs();
    // Valid from the start of today (UTC) for a year, as upstream's.
    let today = k8s_openapi::jiff::Timestamp::from_second(stamp)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .date();
    let (y, m, d) = (today.year() as i32, today.month() as u8, today.day() as u8);
    let year = |p: &mut rcgen::CertificateParams| {
        p.not_before = rcgen::date_time_ymd(y, m, d);
        p.not_after = rcgen::date_time_ymd(y + 1, m, d.min(28));
    };
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{hostname}-ca@{stamp}"));
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    year(&mut ca);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let server_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{hostname}@{stamp}"));
    p.subject_alt_names = serving_sans(hostname, ips);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    year(&mut p);
    let cert = p.signed_by(&server_key, &issuer)?;
    // The certificate, then its CA: the chain a client verifies.
    let chain = format!("{}{}", cert.pem(), ca_cert.pem());
    write_private(&crt, chain.into_bytes()).await?;
    write_private(&key, server_key.serialize_pem().into_bytes()).await?;
    info!(cert = %crt.display(), "wrote a self-signed serving certificate");
    Ok((crt, key))
}

/// `serverTLSBootstrap`: a serving certificate from the cluster's
/// `kubernetes.io/kubelet-serving` signer, for the node's hostname and
/// addresses, behind `<cert-dir>/kubelet-server-current.pem`.
pub async fn bootstrap_serving(
    client: kube::Client,
    cert_dir: &Path,
    node_name: &str,
    hostname: &str,
    ips: &[std::net::IpAddr],
) -> Result<PathBuf, CertError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let sans = serving_sans(hostname, ips);
    let cert = request_for(
        client,
        &key,
        node_name,
        SERVING_SIGNER,
        "server auth",
        &sans,
    )
    .await?;
    let current = store_pair(cert_dir, "kubelet-server", &cert, &key.serialize_pem()).await?;
    info!(cert = %current.display(), "serving certificate issued");
    Ok(current)
}

/// A point 70-90 % into a certificate's lifetime, as upstream's
/// certificate manager picks its rotation deadline (jittered so a fleet does
/// not renew at once).
pub fn rotation_deadline(not_before: i64, not_after: i64, jitter: f64) -> i64 {
    let life = (not_after - not_before).max(0);
    let per_mille = 700 + (200.0 * jitter.clamp(0.0, 1.0)).round() as i64;
    not_before + life * per_mille / 1000
}

/// How long until a certificate valid from `not_before` to `not_after` is
/// due for renewal (a jittered 70-90 % into its life; zero if past).
pub fn rotation_wait(not_before: i64, not_after: i64) -> Duration {
    let jitter = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        % 1000) as f64
        / 1000.0;
    let deadline = rotation_deadline(not_before, not_after, jitter);
    Duration::from_secs((deadline - now_secs()).max(0) as u64)
}

/// Whether the kubeconfig uses the cert-dir's rotating client pair.
pub fn uses_rotating_pair(kubeconfig: &Path, cert_dir: &Path) -> bool {
    let current = cert_dir.join(CURRENT_CLIENT_PEM);
    std::fs::read_to_string(kubeconfig)
        .is_ok_and(|t| t.contains(current.to_string_lossy().as_ref()))
}

/// Rotates the client certificate until `token` is cancelled (upstream
/// `rotateCertificates`): at the rotation deadline, a new key and a CSR sent
/// with the current credentials; once issued, the pair is stored behind
/// `kubelet-client-current.pem` and the API client is rebuilt from the
/// kubeconfig, so requests and watches go on with the new certificate and
/// nothing restarts.
pub async fn rotate_client_cert(
    api: crate::apiclient::ApiClient,
    kubeconfig: PathBuf,
    cert_dir: PathBuf,
    node: String,
    token: tokio_util::sync::CancellationToken,
) {
    use crate::metrics::certvol::Cert::Client;
    let current = cert_dir.join(CURRENT_CLIENT_PEM);
    loop {
        let pem = match tokio::fs::read(&current).await {
            Ok(p) => p,
            Err(e) => {
                warn!(cert = %current.display(), error = %e, "no client certificate to rotate");
                return;
            }
        };
        let (nb, na) = match validity(&pem) {
            Ok(v) => v,
            Err(e) => {
                warn!(error = %e, "cannot read the client certificate's lifetime; not rotating");
                return;
            }
        };
        let wait = rotation_wait(nb, na);
        info!(rotate_in = ?wait, "client certificate rotation scheduled");
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let mut backoff = Duration::from_secs(1);
        loop {
            let attempt = async {
                let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
                let cert = request_certificate(api.client().await, &key, &node).await?;
                let na = not_after(cert.as_bytes())?;
                store_client_pair(&cert_dir, &cert, &key.serialize_pem()).await?;
                Ok::<i64, CertError>(na)
            };
            let r = tokio::select! {
                _ = token.cancelled() => return,
                r = attempt => r,
            };
            match r {
                Ok(na) => {
                    // Stored: from now on the certificate in use.
                    crate::metrics::certvol::set_certificate_not_after(Client, Some(na));
                    match api.reload(&kubeconfig).await {
                        Ok(()) => {
                            info!("client certificate rotated");
                            break;
                        }
                        Err(e) => {
                            warn!(error = %e, "rotated certificate stored but the client could not be rebuilt")
                        }
                    }
                }
                Err(e) => {
                    crate::metrics::certvol::certificate_renew_failed(Client);
                    warn!(error = %e, retry_in = ?backoff, "client certificate rotation failed")
                }
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(300));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate valid until the start of `until_year`.
    fn self_signed(until_year: i32) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["n1".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(until_year, 1, 1);
        let cert = p.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn kubeconfig_with(dir: &Path, cert: &Path) -> PathBuf {
        let p = dir.join("kubelet.conf");
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    client-certificate: {0}\n    client-key: {0}\n",
                cert.display()
            ),
        )
        .unwrap();
        p
    }

    fn tempdir(name: &str) -> PathBuf {
        crate::testutil::tempdir(&format!("cert-{name}"))
    }

    #[test]
    fn rotation_happens_70_to_90_percent_into_the_lifetime() {
        assert_eq!(rotation_deadline(0, 1000, 0.0), 700);
        assert_eq!(rotation_deadline(0, 1000, 1.0), 900);
        assert_eq!(rotation_deadline(100, 1100, 0.5), 900);
    }

    #[test]
    fn a_kubeconfig_with_an_expired_client_certificate_is_not_valid() {
        let d = tempdir("expiry");
        let (good, key) = self_signed(2099);
        let pem = d.join("good.pem");
        std::fs::write(&pem, format!("{good}{key}")).unwrap();
        assert!(kubeconfig_still_valid(&kubeconfig_with(&d, &pem)));
        let (old, key) = self_signed(2021);
        std::fs::write(&pem, format!("{old}{key}")).unwrap();
        assert!(!kubeconfig_still_valid(&kubeconfig_with(&d, &pem)));
        assert!(!kubeconfig_still_valid(&d.join("missing.conf")));
    }

    #[tokio::test]
    async fn the_client_ttl_reads_the_current_pair_else_the_kubeconfigs_certificate() {
        let d = tempdir("ttl");
        let (cert, key) = self_signed(2099);
        let pem = d.join("own.pem");
        std::fs::write(&pem, format!("{cert}{key}")).unwrap();
        let kc = kubeconfig_with(&d, &pem);
        let own = not_after(cert.as_bytes()).unwrap();
        assert_eq!(client_cert_not_after(&kc, &d).await, Some(own));
        // Once a pair is stored behind the symlink, that one is in use.
        let (cert, key) = self_signed(2098);
        store_client_pair(&d, &cert, &key).await.unwrap();
        let current = not_after(cert.as_bytes()).unwrap();
        assert_ne!(current, own);
        assert_eq!(client_cert_not_after(&kc, &d).await, Some(current));
        // No certificate at all: none (the gauge shows +Inf).
        let empty = tempdir("ttl-none");
        assert_eq!(
            client_cert_not_after(&empty.join("missing.conf"), &empty).await,
            None
        );
    }

    #[tokio::test]
    async fn the_client_pair_is_stored_behind_the_current_symlink() {
        let d = tempdir("store");
        let (cert, key) = self_signed(2099);
        let current = store_client_pair(&d, &cert, &key).await.unwrap();
        assert_eq!(current, d.join(CURRENT_CLIENT_PEM));
        let target = std::fs::read_link(&current).unwrap();
        let name = target.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            name.starts_with("kubelet-client-2") && name.ends_with(".pem"),
            "{name}"
        );
        let body = std::fs::read_to_string(&current).unwrap();
        assert!(body.contains("BEGIN CERTIFICATE") && body.contains("PRIVATE KEY"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // The written kubeconfig uses it and is valid.
        let bkc = kube::config::Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\ncontexts:\n- name: b\n  context:\n    cluster: k\n    user: boot\ncurrent-context: b\nusers:\n- name: boot\n  user:\n    token: abc.def\n",
        )
        .unwrap();
        let text = client_kubeconfig(&bkc, &current).unwrap();
        let kc = d.join("kubelet.conf");
        std::fs::write(&kc, &text).unwrap();
        assert!(kubeconfig_still_valid(&kc), "{text}");
        assert!(text.contains("https://10.0.0.1:6443") && text.contains("Q0E="));
    }
}
