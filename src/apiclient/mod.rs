//! The API server client of cluster mode: a kube-rs `Client` built from
//! `--kubeconfig`, behind upstream's client-side rate limit (client-go's
//! token bucket: `kubeAPIQPS` tokens a second, at most `kubeAPIBurst` saved),
//! taken per request by the client's metrics layer as client-go's
//! `tryThrottle` does (watches are not throttled).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    #[error("cannot read kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build the API client from {}: {source}", path.display())]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
    #[error("building the API client from {}: {source}", path.display())]
    Blocking {
        path: PathBuf,
        #[source]
        source: crate::blocking::BlockingError,
    },
}

/// How long reading a kubeconfig and the files it names may take.
const BUILD_DEADLINE: Duration = Duration::from_secs(30);

/// A cloneable handle: the kube client and the shared rate limiter.
#[derive(Clone)]
pub struct ApiClient {
    /// Swapped when the client certificate is rotated: the client of every
    /// request, and the heartbeat client.
    client: Arc<Mutex<(kube::Client, kube::Client)>>,
    limiter: Arc<RateLimiter>,
    /// Bumped on each swap, so long-lived watches reopen with the new
    /// credentials.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient").finish_non_exhaustive()
    }
}

/// The client of `path`'s kubeconfig; its requests wait for `limiter`.
async fn build(
    path: &Path,
    limiter: Option<&Arc<RateLimiter>>,
) -> Result<kube::Client, ApiClientError> {
    let kubeconfig_err = |source| ApiClientError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(kubeconfig_err)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(kubeconfig_err)?;
    // A request that hangs (a partitioned API server) must fail and be
    // retried, not block its loop; watches set their own server-side
    // timeout below this.
    config.read_timeout = Some(Duration::from_secs(330));
    config.connect_timeout = Some(Duration::from_secs(10));
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    crate::metrics::transport::kubelet_client_built(&config);
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|source| ApiClientError::Client {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(builder
        .with_layer(&crate::metrics::RestClientLayer::new(
            &host,
            limiter.cloned(),
        ))
        .build())
}

impl ApiClient {
    /// Reads the kubeconfig (client certificate files or a bearer token)
    /// and builds the client. Nothing is sent to the API server yet.
    pub async fn from_kubeconfig(
        path: &Path,
        qps: i32,
        burst: i32,
    ) -> Result<Self, ApiClientError> {
        let limiter = Arc::new(RateLimiter::new(qps, burst));
        let clients = Self::build_both(path, &limiter).await?;
        Ok(Self::with_limiter(clients, limiter))
    }

    /// Upstream's two clients of one kubeconfig: the kubelet's, under the
    /// rate limit, and the heartbeat client (`heartbeatClientConfig.QPS =
    /// -1`, cmd/kubelet/app/server.go), so a burst of pod status updates
    /// never delays a lease renewal or a node status update.
    async fn build_both(
        path: &Path,
        limiter: &Arc<RateLimiter>,
    ) -> Result<(kube::Client, kube::Client), ApiClientError> {
        // kube-rs reads the kubeconfig, its certificate files and any exec
        // plugin's output with blocking calls: on the blocking pool, in
        // the runtime's context (the clients' connection pools need it).
        let (p, l) = (path.to_path_buf(), limiter.clone());
        let rt = tokio::runtime::Handle::current();
        crate::blocking::run(
            format!("apiclient/{}", path.display()),
            BUILD_DEADLINE,
            move || rt.block_on(async { Ok((build(&p, Some(&l)).await?, build(&p, None).await?)) }),
        )
        .await
        .map_err(|source| ApiClientError::Blocking {
            path: path.to_path_buf(),
            source,
        })?
    }

    /// A client built elsewhere (tests), also used for heartbeats:
    /// requests go through whatever layers it has, so no rate limit unless
    /// it has one.
    pub fn new(client: kube::Client, qps: i32, burst: i32) -> Self {
        Self::with_limiter(
            (client.clone(), client),
            Arc::new(RateLimiter::new(qps, burst)),
        )
    }

    fn with_limiter(clients: (kube::Client, kube::Client), limiter: Arc<RateLimiter>) -> Self {
        ApiClient {
            client: Arc::new(Mutex::new(clients)),
            limiter,
            generation: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// The current client (its requests wait for the rate limit).
    pub async fn client(&self) -> kube::Client {
        self.client.lock().0.clone()
    }

    /// The client of node status updates and lease renewals, never
    /// throttled (the callers bound each try with upstream's heartbeat
    /// timeout).
    pub async fn heartbeat_client(&self) -> kube::Client {
        self.client.lock().1.clone()
    }

    /// Rebuilds the client from the kubeconfig (after a certificate
    /// rotation) and tells the watches to reopen with it.
    pub async fn reload(&self, path: &Path) -> Result<(), ApiClientError> {
        let fresh = Self::build_both(path, &self.limiter).await?;
        *self.client.lock() = fresh;
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// Changes when the client is swapped.
    pub fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

/// Whether the API server answered the kubelet's last heartbeat, for
/// `/healthz?verbose`.
#[derive(Debug, Clone)]
pub struct ApiHealth(Arc<Mutex<Option<String>>>);

impl Default for ApiHealth {
    fn default() -> Self {
        ApiHealth(Arc::new(Mutex::new(Some("not contacted yet".into()))))
    }
}

impl ApiHealth {
    pub fn ok(&self) {
        *self.0.lock() = None;
    }

    pub fn failed(&self, error: String) {
        *self.0.lock() = Some(error);
    }

    pub fn status(&self) -> Result<(), String> {
        match &*self.0.lock() {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }
}

/// client-go's flowcontrol token bucket. A QPS of zero or less falls back
/// to client-go's defaults (5 QPS, burst 10), as a zero rest.Config does.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(qps: i32, burst: i32) -> Self {
        let qps = if qps > 0 { qps as f64 } else { 5.0 };
        let burst = if burst > 0 { burst as u32 } else { 10 };
        Self::exact(qps, burst)
    }

    /// A bucket of exactly `burst` tokens refilled at `qps` a second, with
    /// no client-go defaulting (the image puller's registryPullQPS/Burst).
    pub fn exact(qps: f64, burst: u32) -> Self {
        RateLimiter {
            qps,
            burst: burst as f64,
            state: Mutex::new((burst as f64, Instant::now())),
        }
    }

    /// client-go's TryAccept: takes a token if one is there, never waits
    /// and never reserves one ahead.
    pub fn try_accept(&self) -> bool {
        let mut s = self.state.lock();
        let now = Instant::now();
        let refill = now.saturating_duration_since(s.1).as_secs_f64() * self.qps;
        s.0 = (s.0 + refill).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes one token, waiting until one is there. Tokens are reserved in
    /// order, so waiters are served first come, first served.
    pub async fn acquire(&self) {
        let wait = {
            let mut s = self.state.lock();
            let now = Instant::now();
            let refill = now.saturating_duration_since(s.1).as_secs_f64() * self.qps;
            s.0 = (s.0 + refill).min(self.burst) - 1.0;
            s.1 = now;
            if s.0 >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-s.0 / self.qps)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet's client waits for the rate limit; the heartbeat client
    /// of the same kubeconfig does not (upstream's QPS -1), also after a
    /// reload.
    #[tokio::test]
    async fn heartbeats_skip_the_rate_limit_that_other_requests_take() {
        use k8s_openapi::api::core::v1::Node;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(|| async {
            (
                [("content-type", "application/json")],
                r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}"#,
            )
        });
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = crate::testutil::tempdir("apiclient-heartbeat");
        let kc = crate::testutil::plain_http_kubeconfig(&dir, addr);
        let api = ApiClient::from_kubeconfig(&kc, 50, 100).await.unwrap();
        let host = addr.to_string();
        let throttled = || crate::metrics::rest_client_throttled_count(&host, "GET");
        for round in 0..2 {
            let before = throttled();
            let nodes: kube::Api<Node> = kube::Api::all(api.heartbeat_client().await);
            nodes.get("n").await.unwrap();
            assert_eq!(
                throttled(),
                before,
                "round {round}: a heartbeat is not throttled"
            );
            let nodes: kube::Api<Node> = kube::Api::all(api.client().await);
            nodes.get("n").await.unwrap();
            assert_eq!(throttled(), before + 1, "round {round}: a request is");
            api.reload(&kc).await.unwrap();
        }
        server.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn the_burst_is_free_then_requests_are_spaced_by_qps() {
        let l = RateLimiter::new(50, 100);
        let t0 = Instant::now();
        for _ in 0..100 {
            l.acquire().await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO, "the burst waits for nothing");
        for _ in 0..50 {
            l.acquire().await;
        }
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1010),
            "50 more at 50 QPS take a second, took {waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn try_accept_takes_the_burst_then_refills_without_waiting() {
        let l = RateLimiter::exact(1.0, 2);
        assert!(l.try_accept() && l.try_accept());
        assert!(!l.try_accept(), "the burst is spent");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!l.try_accept(), "a refused try reserves nothing");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(l.try_accept(), "one token a second");
        assert!(!l.try_accept());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(
            l.try_accept() && l.try_accept() && !l.try_accept(),
            "capped at the burst"
        );
        let none = RateLimiter::exact(5.0, 0);
        assert!(
            !none.try_accept(),
            "burst 0 accepts nothing, as rate.Limiter"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_falls_back_to_client_go_defaults() {
        let l = RateLimiter::new(0, 0);
        let t0 = Instant::now();
        for _ in 0..15 {
            l.acquire().await;
        }
        // 10 from the burst, 5 more at 5 QPS: one second.
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1010),
            "{waited:?}"
        );
    }
}
