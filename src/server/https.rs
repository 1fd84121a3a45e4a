//! Serving: one accept loop for the three ports (TLS on :10250), with the
//! connection limits of upstream's `http.Server` (header size, idle
//! connections closed, a slow client never holds others up), and the TLS
//! settings of `tlsCertFile`/`tlsMinVersion`/`tlsCipherSuites` on rustls.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Upstream's kubelet server: `MaxHeaderBytes: 1 << 20`.
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// Upstream's `IdleTimeout: 90s` (http.DefaultTransport's keep-alive).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// A request's headers must arrive within this (Go closes a connection
/// whose headers outlast its read timeout; a slowloris client is cut off
/// here long before upstream's 4 h body timeout).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The TLS handshake must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("tlsCipherSuites: cipher suite {0} not supported or doesn't exist")]
    UnknownSuite(String),
    #[error("tlsCipherSuites: none of {0:?} is supported by rkubelet's TLS library (rustls: ECDHE with AES-GCM or ChaCha20-Poly1305)")]
    NoSupportedSuite(Vec<String>),
    #[error("tlsCurvePreferences: unknown curve ID {0}")]
    UnknownCurve(i32),
    #[error(
        "tlsCurvePreferences: none of {0:?} is supported by rustls (23 P-256, 24 P-384, 29 X25519)"
    )]
    NoSupportedCurve(Vec<i32>),
    #[error("tlsMinVersion: unknown TLS version {0:?} (VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13)")]
    UnknownVersion(String),
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Go's cipher suite names (`k8s.io/component-base/cli/flag`
/// ciphersuites_flag.go) that rustls implements, with the suite.
fn rustls_suite(name: &str) -> Option<rustls::SupportedCipherSuite> {
    use rustls::crypto::ring::cipher_suite as cs;
    Some(match name {
        "TLS_AES_128_GCM_SHA256" => cs::TLS13_AES_128_GCM_SHA256,
        "TLS_AES_256_GCM_SHA384" => cs::TLS13_AES_256_GCM_SHA384,
        "TLS_CHACHA20_POLY1305_SHA256" => cs::TLS13_CHACHA20_POLY1305_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ => return None,
    })
}

/// Names Go knows that rustls does not implement (CBC, RC4, 3DES, static
/// RSA key exchange): accepted with a warning, as they cannot be offered.
const GO_ONLY_SUITES: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_RC4_128_SHA",
];

/// The crypto provider for `tlsCipherSuites`: every rustls suite when the
/// list is empty. As in Go, TLS 1.3 suites are always enabled (Go does not
/// let them be configured).
pub fn provider(suites: &[String], curves: &[i32]) -> Result<CryptoProvider, TlsError> {
    let mut p = rustls::crypto::ring::default_provider();
    if !curves.is_empty() {
        p.kx_groups = kx_groups(curves)?;
    }
    if suites.is_empty() {
        return Ok(p);
    }
    let mut chosen = Vec::new();
    for name in suites {
        match rustls_suite(name) {
            Some(s) => chosen.push(s),
            None if GO_ONLY_SUITES.contains(&name.as_str()) => {
                warn!(suite = %name, "tlsCipherSuites: suite not implemented by rustls; not offered")
            }
            None => return Err(TlsError::UnknownSuite(name.clone())),
        }
    }
    if !chosen
        .iter()
        .any(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)))
    {
        return Err(TlsError::NoSupportedSuite(suites.to_vec()));
    }
    for s in p.cipher_suites.iter() {
        if matches!(s, rustls::SupportedCipherSuite::Tls13(_)) && !chosen.contains(s) {
            chosen.push(*s);
        }
    }
    p.cipher_suites = chosen;
    Ok(p)
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// `tlsCurvePreferences` (Go's `tls.CurveID` numbers) as rustls key
/// exchange groups, in the order given. P-521 (25) and X25519MLKEM768
/// (4588) are not in rustls' ring provider: warned about and skipped.
fn kx_groups(
    curves: &[i32],
) -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, TlsError> {
    use rustls::crypto::ring::kx_group;
    let mut groups = Vec::new();
    for id in curves {
        match id {
            23 => groups.push(kx_group::SECP256R1),
            24 => groups.push(kx_group::SECP384R1),
            29 => groups.push(kx_group::X25519),
            25 | 4588 => warn!(
                curve = id,
                "tlsCurvePreferences: curve not implemented by rustls; not offered"
            ),
            other => return Err(TlsError::UnknownCurve(*other)),
        }
    }
    if groups.is_empty() {
        return Err(TlsError::NoSupportedCurve(curves.to_vec()));
    }
    Ok(groups)
}

/// `tlsMinVersion` as rustls protocol versions. rustls has no TLS 1.0 or
/// 1.1: those minimums mean 1.2, said once in the log.
pub fn versions(
    min: &str,
) -> Result<&'static [&'static rustls::SupportedProtocolVersion], TlsError> {
    match min {
        "" | "VersionTLS12" => Ok(rustls::ALL_VERSIONS),
        "VersionTLS10" | "VersionTLS11" => {
            warn!(tls_min_version = %min, "rustls speaks TLS 1.2 and 1.3 only; the effective minimum is TLS 1.2");
            Ok(rustls::ALL_VERSIONS)
        }
        "VersionTLS13" => Ok(TLS13_ONLY),
        other => Err(TlsError::UnknownVersion(other.into())),
    }
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// `tlsCertFile` and `tlsPrivateKeyFile` (or the self-signed pair).
    Files { cert: PathBuf, key: PathBuf },
    /// One PEM with certificate and key (`kubelet-server-current.pem`).
    Combined(PathBuf),
}

/// The serving certificate, re-read when its files change so a rotated
/// certificate is served without a restart (upstream's dynamic serving
/// content / certificate manager).
#[derive(Debug)]
pub struct CertReloader {
    source: CertSource,
    provider: Arc<CryptoProvider>,
    current: RwLock<Option<(Vec<u8>, Arc<CertifiedKey>)>>,
}

fn read(path: &PathBuf) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.clone(),
        source,
    })
}

impl CertReloader {
    pub fn new(source: CertSource, provider: Arc<CryptoProvider>) -> Arc<Self> {
        Arc::new(CertReloader {
            source,
            provider,
            current: RwLock::new(None),
        })
    }

    /// Reads the files (blocking: call off the async threads) and swaps
    /// the certificate in when they changed. Returns whether it changed.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (cert_path, key_path) = match &self.source {
            CertSource::Files { cert, key } => (cert.clone(), key.clone()),
            CertSource::Combined(p) => (p.clone(), p.clone()),
        };
        let cert_pem = read(&cert_path)?;
        let key_pem = if key_path == cert_path {
            cert_pem.clone()
        } else {
            read(&key_path)?
        };
        let mut fingerprint = cert_pem.clone();
        fingerprint.extend_from_slice(&key_pem);
        if self
            .current
            .read()
            .as_ref()
            .is_some_and(|(f, _)| *f == fingerprint)
        {
            return Ok(false);
        }
        let pem_err = |path: &PathBuf, reason: String| TlsError::Pem {
            path: path.clone(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| pem_err(&cert_path, e.to_string()))?;
        if chain.is_empty() {
            return Err(pem_err(&cert_path, "no certificate found".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| pem_err(&key_path, format!("no private key: {e}")))?;
        let signing = self.provider.key_provider.load_private_key(key)?;
        let ck = CertifiedKey::new(chain, signing);
        ck.keys_match()
            .map_err(|e| pem_err(&cert_path, format!("certificate and key do not match: {e}")))?;
        *self.current.write() = Some((fingerprint, Arc::new(ck)));
        Ok(true)
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().as_ref().map(|(_, ck)| ck.clone())
    }
}

/// Asks for a client certificate and checks the handshake signature (the
/// client holds the key), but leaves the chain to the authenticator: as
/// Go's `RequestClientCert`, a certificate from another CA then gets
/// upstream's 401 instead of a failed handshake.
#[derive(Debug)]
pub struct RequestClientCert {
    inner: Arc<dyn ClientCertVerifier>,
}

impl RequestClientCert {
    pub fn new(inner: Arc<dyn ClientCertVerifier>) -> Arc<Self> {
        Arc::new(RequestClientCert { inner })
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn ca_verifier(
    path: &std::path::Path,
    pem: &[u8],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let bad = |reason: String| TlsError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        roots.add(c.map_err(|e| bad(e.to_string()))?)?;
    }
    if roots.is_empty() {
        return Err(bad("no CA certificate found".into()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// The client CA bundle (`authentication.x509.clientCAFile`) as a chain
/// verifier, re-read when the file changes (upstream reloads it too, so a
/// rotated cluster CA needs no kubelet restart).
pub struct ClientCa {
    path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Vec<u8>, Arc<dyn ClientCertVerifier>)>,
}

impl ClientCa {
    /// Reads the bundle (blocking: call off the async threads).
    pub fn load(path: PathBuf, provider: Arc<CryptoProvider>) -> Result<Arc<Self>, TlsError> {
        let pem = read(&path)?;
        let v = ca_verifier(&path, &pem, provider.clone())?;
        Ok(Arc::new(ClientCa {
            path,
            provider,
            current: RwLock::new((pem, v)),
        }))
    }

    pub fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.read().1.clone()
    }

    /// Re-reads the file; true when it changed and was taken. A broken
    /// file keeps the bundle in use.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let pem = read(&self.path)?;
        if self.current.read().0 == pem {
            return Ok(false);
        }
        let v = ca_verifier(&self.path, &pem, self.provider.clone())?;
        *self.current.write() = (pem, v);
        Ok(true)
    }
}

/// The TLS configuration of :10250, taken per connection so a reloaded
/// client CA applies to new connections at once.
pub struct TlsSource {
    provider: Arc<CryptoProvider>,
    min_version: String,
    certs: Arc<CertReloader>,
    client_ca: Option<Arc<ClientCa>>,
    config: RwLock<Arc<rustls::ServerConfig>>,
}

impl TlsSource {
    pub fn new(
        provider: Arc<CryptoProvider>,
        min_version: &str,
        certs: Arc<CertReloader>,
        client_ca: Option<Arc<ClientCa>>,
    ) -> Result<Arc<Self>, TlsError> {
        let config = build_config(&provider, min_version, &certs, client_ca.as_deref())?;
        Ok(Arc::new(TlsSource {
            provider,
            min_version: min_version.into(),
            certs,
            client_ca,
            config: RwLock::new(Arc::new(config)),
        }))
    }

    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config.read().clone()
    }

    /// Re-reads the serving certificate and the client CA every `period`
    /// until cancelled; a changed CA rebuilds the configuration.
    pub async fn watch(self: Arc<Self>, period: Duration, token: CancellationToken) {
        loop {
            let me = self.clone();
            let r = crate::blocking::run("tls-files".into(), Duration::from_secs(10), move || {
                let cert = me.certs.reload();
                let ca = me.client_ca.as_ref().map(|c| c.reload());
                (cert, ca)
            })
            .await;
            match r {
                Ok((cert, ca)) => {
                    match cert {
                        Ok(true) => {
                            info!(source = ?self.certs.source, "serving certificate loaded")
                        }
                        Ok(false) => {}
                        Err(e) => debug!(error = %e, "serving certificate not (yet) readable"),
                    }
                    match ca {
                        Some(Ok(true)) => {
                            match build_config(
                                &self.provider,
                                &self.min_version,
                                &self.certs,
                                self.client_ca.as_deref(),
                            ) {
                                Ok(c) => {
                                    *self.config.write() = Arc::new(c);
                                    info!("client CA bundle reloaded");
                                }
                                Err(e) => {
                                    warn!(error = %e, "client CA changed but TLS setup failed; keeping the old one")
                                }
                            }
                        }
                        Some(Err(e)) => {
                            warn!(error = %e, "reading the client CA bundle; keeping the one in use")
                        }
                        _ => {}
                    }
                }
                Err(e) => warn!(error = %e, "reading the TLS files"),
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }
}

fn build_config(
    provider: &Arc<CryptoProvider>,
    min_version: &str,
    certs: &Arc<CertReloader>,
    client_ca: Option<&ClientCa>,
) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions(min_version)?)?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(RequestClientCert::new(ca.verifier())),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(certs.clone());
    // HTTP/1.1 only: the streaming endpoints upgrade the connection.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The client certificates of a TLS connection, put on each of its
/// requests for the authenticator.
#[derive(Clone, Debug, Default)]
pub struct PeerCerts(pub Arc<Vec<CertificateDer<'static>>>);

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct ListenError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds now (so a busy port is reported at startup) and serves `router`
/// (over TLS when `tls` is given) until the token is cancelled.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Option<Arc<TlsSource>>,
    token: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ListenError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError { addr, source })?;
    info!(%addr, tls = tls.is_some(), "serving");
    Ok(tokio::spawn(tracing::Instrument::instrument(
        accept_loop(listener, router, tls, token),
        tracing::info_span!("server", %addr),
    )))
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<TlsSource>>,
    token: CancellationToken,
) {
    let conns = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = token.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off briefly, keep serving.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (router, tls, token) = (router.clone(), tls.clone(), token.clone());
        conns.spawn(async move {
            match tls {
                None => connection(stream, peer, router, PeerCerts::default(), token).await,
                Some(src) => {
                    let handshake = async {
                        let start = tokio_rustls::LazyConfigAcceptor::new(
                            rustls::server::Acceptor::default(),
                            stream,
                        )
                        .await?;
                        start.into_stream(src.config()).await
                    };
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    let certs = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                        .unwrap_or_default();
                    connection(tls, peer, router, PeerCerts(Arc::new(certs)), token).await
                }
            }
        });
    }
    conns.close();
    // In-flight requests get a moment; streams and follows are cut.
    let _ = tokio::time::timeout(Duration::from_secs(5), conns.wait()).await;
}

/// Activity on a connection: the last read or write, and the requests in
/// flight (a long response, e.g. `follow`, is not idleness).
#[derive(Default)]
struct Activity {
    last: AtomicU64,
    in_flight: AtomicUsize,
}

fn now_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

/// Wraps the connection's IO to note each read and write.
struct Tracked<S> {
    io: S,
    act: Arc<Activity>,
    epoch: Instant,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.act.last.store(now_ms(self.epoch), Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.act.last.store(now_ms(self.epoch), Ordering::Relaxed);
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    // Forwarded so hyper sees a vectored writer and writes response bodies
    // straight from their buffers; without it hyper copies every body
    // (4 MB for a cAdvisor scrape at 110 pods) into its own buffer first.
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.act.last.store(now_ms(self.epoch), Ordering::Relaxed);
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Decrements the in-flight count when a request's response is done.
struct InFlight(Arc<Activity>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection<S>(
    io: S,
    peer: SocketAddr,
    router: Router,
    certs: PeerCerts,
    token: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let act = Arc::new(Activity::default());
    let epoch = Instant::now();
    let io = Tracked {
        io,
        act: act.clone(),
        epoch,
    };
    let a = act.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(certs.clone());
        // The client's address: the streaming proxy's X-Forwarded-For, and
        // the scrape cadences (one per client) read it.
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(a.clone());
        let router = router.clone();
        async move {
            use tower::ServiceExt;
            let resp = router.oneshot(req.map(axum::body::Body::new)).await;
            // The guard lives as long as the response body is streamed.
            resp.map(|r| {
                r.map(|b| {
                    use http_body_util::BodyExt;
                    // The closure owns the guard: dropped with the body.
                    axum::body::Body::new(b.map_frame(move |f| {
                        let _held = &guard;
                        f
                    }))
                })
            })
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(error = %e, "connection ended");
                }
                return;
            }
            _ = token.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(5), conn.as_mut()).await;
                return;
            }
            _ = tick.tick() => {
                let idle = now_ms(epoch).saturating_sub(act.last.load(Ordering::Relaxed));
                if act.in_flight.load(Ordering::Relaxed) == 0
                    && idle >= IDLE_TIMEOUT.as_millis() as u64
                {
                    debug!("closing idle connection");
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_names_and_curve_ids_map_to_rustls() {
        let p = provider(&[], &[]).unwrap();
        assert_eq!(
            p.cipher_suites.len(),
            rustls::crypto::ring::default_provider().cipher_suites.len()
        );
        let p = provider(
            &[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
                "TLS_RSA_WITH_AES_128_CBC_SHA".into(),
            ],
            &[29, 23],
        )
        .unwrap();
        let tls12: Vec<_> = p
            .cipher_suites
            .iter()
            .filter(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)))
            .collect();
        assert_eq!(tls12.len(), 1, "only the chosen TLS 1.2 suite");
        assert!(p.cipher_suites.len() > 1, "TLS 1.3 suites stay on");
        let names: Vec<_> = p.kx_groups.iter().map(|g| g.name()).collect();
        assert_eq!(
            names,
            [rustls::NamedGroup::X25519, rustls::NamedGroup::secp256r1]
        );
        assert!(matches!(
            provider(&["TLS_BOGUS".into()], &[]),
            Err(TlsError::UnknownSuite(_))
        ));
        assert!(matches!(
            provider(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()], &[]),
            Err(TlsError::NoSupportedSuite(_))
        ));
        assert!(matches!(
            provider(&[], &[7]),
            Err(TlsError::UnknownCurve(7))
        ));
        assert!(versions("VersionTLS13").unwrap().len() == 1);
        assert!(versions("VersionTLS10").is_ok());
        assert!(versions("TLS9").is_err());
    }

    /// Handlers see the client's address (what the streaming proxy's
    /// X-Forwarded-For and the per-client scrape cadences read); it was
    /// never put in the request before.
    #[tokio::test]
    async fn requests_carry_the_clients_address() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let router = Router::new().route(
            "/peer",
            axum::routing::get(
                |axum::extract::ConnectInfo(p): axum::extract::ConnectInfo<SocketAddr>| async move {
                    p.to_string()
                },
            ),
        );
        let token = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(accept_loop(listener, router, None, token.clone()));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let me = c.local_addr().unwrap();
        c.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with(&me.to_string()), "{out} from {me}");
        token.cancel();
        server.await.unwrap();
    }
}
