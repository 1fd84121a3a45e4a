//! client-go's transport cache families, `rest_client_transport_cache_entries`
//! and `rest_client_transport_create_calls_total{result}` (component-base
//! `metrics/prometheus/restclient/metrics.go`, ALPHA, registered at init
//! whatever the process does).
//!
//! Upstream counts in `client-go/transport/cache.go` (`tlsCache.get`, one
//! call per `transport.New`, so one per clientset built):
//! - a config `tlsConfigKey` cannot key (a proxy function: kubeconfig
//!   `proxy-url`) is `uncacheable`;
//! - otherwise `hit` when a transport with the same key exists, else
//!   `miss`; the key is the TLS material (insecure, CA data, client
//!   certificate and key, server name, next protocols, compression off)
//!   and the dial and get-certificate holders;
//! - a miss caches a transport only when the config needs TLS
//!   (`TLSConfigFor` non-nil: a CA, a client certificate, a certificate
//!   callback, insecure or a server name); without, it hands out
//!   `http.DefaultTransport` and caches nothing;
//! - the gauge is the cache's size after each cacheable call (entries are
//!   never dropped in 1.34).
//!
//! What upstream's kubelet 1.34 builds (`cmd/kubelet/app/server.go` `run`,
//! `buildKubeletClientConfig`): the kubelet, event and heartbeat clients
//! from one config. With `rotateCertificates`, `UpdateTransport`
//! (`pkg/kubelet/certificate/transport.go`) gives that config its own
//! `Transport` (its dialer closes connections at rotation), and
//! `transport.New` then never asks the cache: those clients are not
//! counted at all. Without it the config is the kubeconfig's, so the first
//! client misses and the others hit one entry. A bootstrap client
//! (`bootstrap.LoadClientCert`, or the certificate manager's from the
//! bootstrap kubeconfig) goes through the cache in both cases.
//!
//! rkubelet builds its clients itself (kube-rs): each build is counted with
//! what upstream's `get` would record for that client, keyed as
//! `tlsConfigKey` keys it, through [`kubelet_client_built`] (the kubelet's
//! and heartbeat clients: none while rotating) and [`client_built`] (the
//! bootstrap client). Client certificate and key files are keyed by path,
//! not read: upstream keys by their content, which differs only if a file
//! changed between two builds, and rkubelet rebuilds from the same files
//! only after a rotation, when nothing is counted.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// How upstream's cache would take a client's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// `tlsConfigKey` gives up (a proxy).
    Uncacheable,
    /// Keyed; `tls` is whether `TLSConfigFor` returns a config, so a miss
    /// stores a transport.
    Cacheable { key: [u8; 32], tls: bool },
}

/// The `result` label of one `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    Miss,
    Uncacheable,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::Uncacheable => "uncacheable",
        }
    }
}

/// Feeds one field into the key, length first so fields cannot run into
/// each other.
fn field(ctx: &mut ring::digest::Context, tag: u8, value: Option<&[u8]>) {
    ctx.update(&[tag]);
    match value {
        None => ctx.update(&[0]),
        Some(v) => {
            ctx.update(&[1]);
            ctx.update(&(v.len() as u64).to_be_bytes());
            ctx.update(v);
        }
    }
}

/// `tlsConfigKey` of a kube-rs config. The key is kept as a SHA-256 of its
/// fields, so no credential stays in the process for the metric's sake.
pub fn lookup(cfg: &kube::Config) -> Lookup {
    if cfg.proxy_url.is_some() {
        return Lookup::Uncacheable;
    }
    let auth = &cfg.auth_info;
    let cert = auth
        .client_certificate_data
        .as_deref()
        .or(auth.client_certificate.as_deref());
    // The key's own bytes stay out of the hash: the certificate it goes
    // with already tells pairs apart.
    let key_path = auth.client_key.as_deref();
    let has_key = key_path.is_some() || auth.client_key_data.is_some();
    // An exec plugin's authenticator adds a certificate callback
    // (HasCertCallback); rkubelet keys it by its command line.
    let exec = auth
        .exec
        .as_ref()
        .map(|e| format!("{:?} {:?}", e.command, e.args));
    let ca: Option<Vec<u8>> = cfg.root_cert.as_ref().map(|certs| certs.concat());
    let ca_file = cfg
        .root_cert_file
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned());
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    field(&mut ctx, 1, Some(&[u8::from(cfg.accept_invalid_certs)]));
    field(&mut ctx, 2, ca.as_deref());
    field(&mut ctx, 3, ca_file.as_deref().map(str::as_bytes));
    field(&mut ctx, 4, cert.map(str::as_bytes));
    field(&mut ctx, 5, key_path.map(str::as_bytes));
    field(&mut ctx, 6, Some(&[u8::from(has_key)]));
    field(
        &mut ctx,
        7,
        cfg.tls_server_name.as_deref().map(str::as_bytes),
    );
    field(&mut ctx, 8, Some(&[u8::from(cfg.disable_compression)]));
    field(&mut ctx, 9, exec.as_deref().map(str::as_bytes));
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    // TLSConfigFor: HasCA, HasCertAuth, HasCertCallback, Insecure or a
    // server name.
    let tls = ca.is_some()
        || ca_file.is_some()
        || (cert.is_some() && has_key)
        || exec.is_some()
        || cfg.accept_invalid_certs
        || cfg.tls_server_name.is_some();
    Lookup::Cacheable { key, tls }
}

/// The cache as upstream would hold it, and the calls' outcomes.
#[derive(Debug, Default)]
pub struct TransportCache {
    entries: HashSet<[u8; 32]>,
    /// hit, miss, uncacheable.
    calls: [u64; 3],
}

impl TransportCache {
    /// One `tlsCache.get`.
    pub fn get(&mut self, l: &Lookup) -> Outcome {
        let o = match l {
            Lookup::Uncacheable => Outcome::Uncacheable,
            Lookup::Cacheable { key, .. } if self.entries.contains(key) => Outcome::Hit,
            Lookup::Cacheable { key, tls } => {
                if *tls {
                    self.entries.insert(*key);
                }
                Outcome::Miss
            }
        };
        self.calls[o as usize] += 1;
        o
    }

    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    pub fn calls(&self, o: Outcome) -> u64 {
        self.calls[o as usize]
    }
}

static CACHE: LazyLock<Mutex<TransportCache>> = LazyLock::new(Mutex::default);

/// Whether the client certificate is rotated (`rotateCertificates`): the
/// kubelet's clients then have upstream's custom transport.
static ROTATING: AtomicBool = AtomicBool::new(false);

/// Set from the configuration at start.
pub(super) fn set_rotating(on: bool) {
    ROTATING.store(on, Ordering::Relaxed);
}

/// The outcome a client of the kubelet's own config records: none with
/// rotation (upstream's `transport.New` skips the cache for a config with
/// its own `Transport`).
pub fn kubelet_client(cache: &mut TransportCache, l: &Lookup, rotating: bool) -> Option<Outcome> {
    (!rotating).then(|| cache.get(l))
}

/// The kubelet's or heartbeat client was built from `cfg`.
pub fn kubelet_client_built(cfg: &kube::Config) {
    let l = lookup(cfg);
    kubelet_client(&mut CACHE.lock(), &l, ROTATING.load(Ordering::Relaxed));
}

/// Another client (the bootstrap one) was built from `cfg`.
pub fn client_built(cfg: &kube::Config) {
    let l = lookup(cfg);
    CACHE.lock().get(&l);
}

const ENTRIES_HELP: &str = alpha!("Number of transport entries in the internal cache.");
const CALLS_HELP: &str = alpha!("Number of calls to get a new transport, partitioned by the result of the operation hit: obtained from the cache, miss: created and added to the cache, uncacheable: created and not cached");

/// Both families, as upstream registers them in restclient's init.
pub(super) const FAMILIES: [(&str, &str); 2] = [
    ("rest_client_transport_cache_entries", ENTRIES_HELP),
    ("rest_client_transport_create_calls_total", CALLS_HELP),
];

/// The gauge (0 from registration) and the counter's series, by result
/// in client_golang's order, each once it was recorded (a vector's series
/// appear with their first increment).
#[derive(Debug)]
pub(super) struct TransportCollector;

impl Collector for TransportCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (entries, calls) = {
            let c = CACHE.lock();
            (c.entries() as i64, c.calls)
        };
        ConstGauge::new(entries).encode(enc.encode_descriptor(
            "rest_client_transport_cache_entries",
            ENTRIES_HELP,
            None,
            MetricType::Gauge,
        )?)?;
        let mut m = enc.encode_descriptor(
            "rest_client_transport_create_calls",
            CALLS_HELP,
            None,
            MetricType::Counter,
        )?;
        for o in [Outcome::Hit, Outcome::Miss, Outcome::Uncacheable] {
            let n = calls[o as usize];
            if n > 0 {
                ConstCounter::new(n).encode(m.encode_family(&[("result", o.as_str())])?)?;
            }
        }
        Ok(())
    }
}
