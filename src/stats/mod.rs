//! The stats provider (instead of cAdvisor): `/stats/summary`,
//! `/metrics/resource` and `/metrics/cadvisor` (upstream
//! `pkg/kubelet/server/stats`, `pkg/kubelet/stats`, and the cAdvisor
//! Prometheus collector). Figures come from cgroup and /proc files read on
//! demand off the async threads, and from the CRI; see `provider`.

pub mod blkio;
pub mod cadence;
pub mod cgroup;
pub mod expo;
pub mod oom;
pub mod processes;
pub mod procfs;
pub mod provider;
pub mod summary;
pub mod textpool;
pub mod types;
pub mod volumes;

use std::sync::{Arc, Weak};

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use provider::{StatsConfig, StatsError, StatsProvider};

use crate::server::{encoding, ServerState};

/// `/stats/summary`, `/metrics/resource`, `/metrics/cadvisor`.
pub fn routes() -> Router<ServerState> {
    Router::new()
        .route("/stats/summary", get(stats_summary).post(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route("/metrics/cadvisor", get(metrics_cadvisor))
}

fn stats_config(s: &ServerState) -> StatsConfig {
    StatsConfig {
        cgroup_root: s.config.cgroup_root.clone(),
        systemd: s.config.cgroup_driver == "systemd",
        root_dir: s.root_dir.clone(),
        pod_logs_dir: s.pod_logs_dir.clone(),
        psi: s.config.feature_gate("KubeletPSI"),
    }
}

/// Who is scraping: the client's address, which the server puts in each
/// request (none in handler tests).
pub(crate) struct Scraper(pub cadence::Client);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Scraper {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        Ok(Scraper(peer.map(|c| c.0.ip())))
    }
}

/// The snapshot for `client`'s scrape of `e`, whose arrival is timed (see
/// `cadence`).
async fn snapshot(
    s: &ServerState,
    e: cadence::Endpoint,
    client: cadence::Client,
) -> Result<Arc<provider::Snapshot>, StatsError> {
    s.stats.scraped(e, client);
    collection(s, e.detail()).await
}

async fn collection(
    s: &ServerState,
    detail: cgroup::Detail,
) -> Result<Arc<provider::Snapshot>, StatsError> {
    s.stats.snapshot(sources(s), stats_config(s), detail).await
}

fn sources(s: &ServerState) -> provider::Sources {
    provider::Sources {
        runtime: s.runtime.clone(),
        images: s.images.clone(),
        pleg: Some(s.pleg.clone()),
    }
}

/// The node's figures (no pod's), with whether the image file system is
/// on its own device: the eviction manager's, and the image garbage
/// collector's through `image_fs_figures`.
pub async fn eviction_sample(s: &ServerState) -> Result<crate::eviction::Sample, StatsError> {
    let node = s.stats.node_snapshot(sources(s), stats_config(s)).await?;
    let n = &node.node;
    let dedicated_image_fs = matches!(
        (&n.rootfs_device, &n.imagefs_device),
        (Some(r), Some(i)) if r != i
    );
    Ok(crate::eviction::Sample {
        summary: summary::build(&node, &s.node_name, false),
        dedicated_image_fs,
    })
}

/// The image file system's size and free bytes (upstream ImageFsStats),
/// for the image garbage collector.
pub async fn image_fs_figures(s: &ServerState) -> Result<crate::images::gc::FsFigures, String> {
    let sample = eviction_sample(s).await.map_err(|e| e.to_string())?;
    let fs = sample.summary.node.runtime.and_then(|r| r.image_fs);
    match fs.map(|f| (f.capacity_bytes, f.available_bytes)) {
        Some((Some(capacity), Some(available))) => Ok(crate::images::gc::FsFigures {
            capacity,
            available,
        }),
        _ => Err("imageFs information is unavailable".into()),
    }
}

/// The pods' figures of the full summary, as `/stats/summary` gives them,
/// for the eviction manager's rounds that rank or check pods.
pub async fn eviction_pod_stats(s: &ServerState) -> Result<Vec<types::PodStats>, StatsError> {
    let snap = collection(s, cgroup::Detail::Summary).await?;
    let cache = s.stats.volume_stats();
    let mut pods = summary::build(&snap, &s.node_name, false).pods;
    for p in &mut pods {
        summary::add_volumes(p, &cache.pod(&p.pod_ref.uid));
    }
    Ok(pods)
}

/// The pod stats of `/stats/summary` (shared with a concurrent summary
/// scrape), for `/metrics`' container log sizes; None when they failed.
pub(crate) async fn summary_snapshot(
    s: &ServerState,
    client: cadence::Client,
) -> Option<Arc<provider::Snapshot>> {
    match snapshot(s, cadence::Endpoint::Metrics, client).await {
        Ok(snap) => Some(snap),
        Err(e) => {
            tracing::warn!(error = %e, "pod stats for the container log sizes failed");
            None
        }
    }
}

/// Upstream's handleSummary: the CPU-and-memory summary only for exactly
/// one `only_cpu_and_memory`, and that `true` (ParseForm: the query, and a
/// POST's form body).
fn only_cpu_and_memory(q: Option<&str>, form: &[u8]) -> bool {
    let values: Vec<String> = url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .chain(url::form_urlencoded::parse(form))
        .filter(|(k, _)| k == "only_cpu_and_memory")
        .map(|(_, v)| v.into_owned())
        .collect();
    values.len() == 1 && values[0] == "true"
}

async fn stats_summary(
    State(s): State<ServerState>,
    Scraper(client): Scraper,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let only = only_cpu_and_memory(q.as_deref(), if form { &body } else { &[] });
    let endpoint = if only {
        cadence::Endpoint::SummaryCpuMemory
    } else {
        cadence::Endpoint::Summary
    };
    match snapshot(&s, endpoint, client).await {
        Ok(snap) => {
            let mut sum = summary::build(&snap, &s.node_name, only);
            // Volumes are the full summary's (upstream's CPU-and-memory
            // summary has none).
            if !only {
                let cache = s.stats.volume_stats();
                for p in &mut sum.pods {
                    summary::add_volumes(p, &cache.pod(&p.pod_ref.uid));
                }
            }
            // Sized from the last summary (about 250 KiB at 110 pods), not
            // grown from empty by doubling and copying.
            static LAST_LEN: std::sync::atomic::AtomicUsize =
                std::sync::atomic::AtomicUsize::new(0);
            let last = LAST_LEN.load(std::sync::atomic::Ordering::Relaxed);
            let mut body = Vec::with_capacity(last + last / 8);
            match serde_json::to_writer(&mut body, &sum).map(|()| body) {
                Ok(b) => {
                    LAST_LEN.store(b.len(), std::sync::atomic::Ordering::Relaxed);
                    ([(header::CONTENT_TYPE, "application/json")], b).into_response()
                }
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "stats summary failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Error: failed to get summary stats: {e}"),
            )
                .into_response()
        }
    }
}

async fn metrics_resource(
    State(s): State<ServerState>,
    Scraper(client): Scraper,
    headers: HeaderMap,
) -> Response {
    let snap = snapshot(&s, cadence::Endpoint::Resource, client).await;
    if let Err(e) = &snap {
        tracing::warn!(error = %e, "resource metrics collection failed");
    }
    let body = expo::resource(snap.as_deref().ok(), &s.node_name);
    // About 75 KiB at 110 pods, gzipped in a fraction of a millisecond:
    // on this thread.
    let enc = encoding::negotiate(&headers);
    encoding::text_response(enc, encoding::encode(enc, vec![body.into()]))
}

async fn metrics_cadvisor(
    State(s): State<ServerState>,
    Scraper(client): Scraper,
    headers: HeaderMap,
) -> Response {
    let t0 = std::time::Instant::now();
    let enc = encoding::negotiate(&headers);
    s.stats.ahead_text().lock().asked(client, enc);
    let snap = snapshot(&s, cadence::Endpoint::Cadvisor, client).await;
    let collected_us = t0.elapsed().as_micros();
    if let Err(e) = &snap {
        tracing::warn!(error = %e, "cadvisor metrics collection failed");
    }
    let snap = snap.ok();
    let text = match snap.as_ref().and_then(|sn| text_ahead(&s, sn, enc)) {
        // Made ahead for this snapshot: sent, or waited for while it is
        // being made (or made here if that failed).
        Some(cell) => cell
            .get_or_try_init(|| cadvisor_text(&s, snap.clone(), enc, collected_us))
            .await
            .cloned(),
        None => cadvisor_text(&s, snap, enc, collected_us).await,
    };
    match text {
        Ok(chunks) => encoding::text_response(enc, chunks),
        Err(e) => {
            tracing::warn!(error = %e, "cadvisor metrics rendering failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Error: rendering cadvisor metrics failed",
            )
                .into_response()
        }
    }
}

/// cAdvisor's text for `snap`, encoded as `enc`.
async fn cadvisor_text(
    s: &ServerState,
    snap: Option<Arc<provider::Snapshot>>,
    enc: encoding::Encoding,
    collected_us: u128,
) -> Result<Vec<Bytes>, tokio::task::JoinError> {
    let m = s.machine.clone();
    // About 12,000 samples at 110 pods, several milliseconds of rendering
    // (and as many again of gzip): off the async thread, which probes and
    // the relist share.
    tokio::task::spawn_blocking(move || {
        let machine = expo::Machine {
            machine_id: &m.machine_id,
            system_uuid: &m.system_uuid,
            boot_id: &m.boot_id,
            cores: m.num_cores,
            memory: m.memory_capacity,
            facts: procfs::machine_facts(),
        };
        let t1 = std::time::Instant::now();
        let chunks = expo::cadvisor_chunks(snap.as_deref(), &machine);
        let rendered_us = t1.elapsed().as_micros();
        let chunks = encoding::encode(enc, chunks);
        tracing::debug!(
            collected_us,
            rendered_us,
            encoded_us = t1.elapsed().as_micros() - rendered_us,
            "cadvisor scrape"
        );
        chunks
    })
    .await
}

/// cAdvisor's text as it is made once for both the collection ahead of a
/// steady scrape and the scrape: whichever comes first renders, the other
/// waits for it.
type TextCell = Arc<tokio::sync::OnceCell<Vec<Bytes>>>;

/// cAdvisor's text made ahead of a steady scrape (see `cadence`): the
/// snapshot collected for it is rendered then too, in the encoding that
/// client's last scrape asked for, so the scrape only sends it. Rendering and
/// gzip are two thirds of a scrape's time at 110 pods once the collection
/// is made ahead. Let go `CACHE_TTL` after it is made (the snapshot's own
/// life), and replaced by the next.
#[derive(Default)]
pub(crate) struct AheadText {
    /// What each client's last cAdvisor scrape negotiated, the latest
    /// last; at most `cadence::CLIENTS_MAX`.
    encs: Vec<(cadence::Client, encoding::Encoding)>,
    /// The text, with the snapshot it shows and its encoding.
    ready: Option<(Weak<provider::Snapshot>, encoding::Encoding, TextCell)>,
}

impl AheadText {
    /// `client`'s cAdvisor scrape negotiated `enc`.
    fn asked(&mut self, client: cadence::Client, enc: encoding::Encoding) {
        self.encs.retain(|(c, _)| *c != client);
        if self.encs.len() == cadence::CLIENTS_MAX {
            self.encs.remove(0);
        }
        self.encs.push((client, enc));
    }

    /// What `client`'s last cAdvisor scrape negotiated.
    fn encoding(&self, client: cadence::Client) -> Option<encoding::Encoding> {
        let found = self.encs.iter().find(|(c, _)| *c == client);
        found.map(|(_, e)| *e)
    }
}

/// The text made (or being made) ahead, when it shows `snap` in `enc`;
/// shared by every scrape of that snapshot (the chunks are
/// reference-counted).
fn text_ahead(
    s: &ServerState,
    snap: &Arc<provider::Snapshot>,
    enc: encoding::Encoding,
) -> Option<TextCell> {
    let g = s.stats.ahead_text().lock();
    let (of, e, cell) = g.ready.as_ref()?;
    (*e == enc && std::ptr::eq(of.as_ptr(), Arc::as_ptr(snap))).then(|| cell.clone())
}

/// Collections ahead of the scrapes that come at a steady period (see
/// `cadence`), with cAdvisor's text made ahead too, until `token` is
/// cancelled.
pub async fn collect_ahead(s: ServerState, token: tokio_util::sync::CancellationToken) {
    let collect = |e: cadence::Endpoint, client: cadence::Client| {
        let s = s.clone();
        async move {
            let snap = match collection(&s, e.detail()).await {
                Ok(snap) => snap,
                Err(err) => {
                    tracing::debug!(error = %err, "collection ahead of a scrape failed");
                    return;
                }
            };
            let enc = match (e, s.stats.ahead_text().lock().encoding(client)) {
                (cadence::Endpoint::Cadvisor, Some(enc)) => enc,
                _ => return,
            };
            // Published before it is made, so a scrape arriving meanwhile
            // waits for it instead of rendering it again.
            let cell = TextCell::default();
            let ready = (Arc::downgrade(&snap), enc, cell.clone());
            let was = s.stats.ahead_text().lock().ready.replace(ready);
            // Its buffers go back to the text pool outside the lock.
            drop(was);
            let made = cell
                .get_or_try_init(|| cadvisor_text(&s, Some(snap), enc, 0))
                .await;
            if let Err(err) = made {
                tracing::debug!(error = %err, "cAdvisor text made ahead failed");
            }
        }
    };
    let expire = || {
        let was = s.stats.ahead_text().lock().ready.take();
        drop(was);
    };
    s.stats.collect_ahead(collect, expire, token).await
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::cri::fake::FakeRuntime;
    use crate::cri::{v1, RuntimeService};

    async fn get(state: &ServerState, path: &str) -> (StatusCode, String) {
        let resp = routes()
            .with_state(state.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let code = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
            .await
            .unwrap();
        (code, String::from_utf8(body.to_vec()).unwrap())
    }

    /// A running pod `web` (uid `u-1`) with container `app` in the fake.
    async fn fake_pod(rt: &FakeRuntime) -> (String, String) {
        add_pod(rt, "web", "ns1", "u-1", "docker.io/library/busybox:1.36").await
    }

    /// A ready sandbox and its running container `app`: their ids.
    async fn add_pod(
        rt: &FakeRuntime,
        name: &str,
        namespace: &str,
        uid: &str,
        image: &str,
    ) -> (String, String) {
        let sb = rt
            .run_pod_sandbox(
                v1::PodSandboxConfig {
                    metadata: Some(v1::PodSandboxMetadata {
                        name: name.into(),
                        namespace: namespace.into(),
                        uid: uid.into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                },
                String::new(),
            )
            .await
            .unwrap();
        let c = rt
            .create_container(
                &sb,
                v1::ContainerConfig {
                    metadata: Some(v1::ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    image: Some(v1::ImageSpec {
                        image: image.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .unwrap();
        rt.start_container(&c).await.unwrap();
        (sb, c)
    }

    fn parse(text: &str) -> prometheus_parse::Scrape {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
    }

    fn sample<'a>(
        s: &'a prometheus_parse::Scrape,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Option<&'a prometheus_parse::Sample> {
        s.samples
            .iter()
            .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
    }

    fn value(s: &prometheus_parse::Sample) -> f64 {
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        }
    }

    #[tokio::test]
    async fn summary_reports_cri_figures_where_no_cgroup_is_found() {
        let rt = Arc::new(FakeRuntime::new());
        let (_, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 5_000_000_000, 4096, 8192);
        let (state, _t) = ServerState::for_tests(rt.clone());
        let (code, body) = get(&state, "/stats/summary").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["node"]["nodeName"], "node");
        assert!(v["node"]["startTime"].is_string());
        assert!(v["node"]["memory"]["workingSetBytes"].as_u64().unwrap() > 0);
        assert!(v["node"]["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);
        assert!(v["node"]["fs"]["capacityBytes"].as_u64().is_some() || v["node"]["fs"].is_object());
        let pod = &v["pods"][0];
        assert_eq!(pod["podRef"]["name"], "web");
        assert_eq!(pod["podRef"]["namespace"], "ns1");
        assert_eq!(pod["podRef"]["uid"], "u-1");
        let ctr = &pod["containers"][0];
        assert_eq!(ctr["name"], "app");
        assert_eq!(ctr["cpu"]["usageCoreNanoSeconds"], 5_000_000_000u64);
        assert_eq!(ctr["memory"]["workingSetBytes"], 4096);
        assert_eq!(ctr["rootfs"]["usedBytes"], 8192);
        // No pod cgroup: the pod's figures are its containers' sums.
        assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 5_000_000_000u64);
        assert_eq!(pod["memory"]["workingSetBytes"], 4096);
        assert_eq!(pod["ephemeral-storage"]["usedBytes"], 8192);
    }

    /// Upstream's summary: a pod is listed for its running containers (a
    /// sandbox alone is not); a CPU figure without a rate yet is 0, not
    /// missing; local ephemeral volumes count in ephemeral storage; the
    /// CPU-and-memory form only for exactly `only_cpu_and_memory=true`.
    #[tokio::test]
    async fn summary_entries_as_upstream_lists_them() {
        let rt = Arc::new(FakeRuntime::new());
        let (_, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 5_000_000_000, 4096, 8192);
        // A second pod whose only sandbox runs no container (pulling).
        rt.run_pod_sandbox(
            v1::PodSandboxConfig {
                metadata: Some(v1::PodSandboxMetadata {
                    name: "pulling".into(),
                    namespace: "ns1".into(),
                    uid: "u-2".into(),
                    attempt: 0,
                }),
                ..Default::default()
            },
            String::new(),
        )
        .await
        .unwrap();
        let (mut state, _t) = ServerState::for_tests(rt.clone());
        // The pod's managed hosts file counts in its ephemeral storage
        // (upstream's getPodEtcHostsStats), by its blocks on disk.
        state.root_dir =
            std::env::temp_dir().join(format!("rkubelet-etc-hosts-{}", std::process::id()));
        let hosts = crate::volume::pod_dir(&state.root_dir, "u-1").join("etc-hosts");
        std::fs::create_dir_all(hosts.parent().unwrap()).unwrap();
        std::fs::write(&hosts, "127.0.0.1 localhost\n".repeat(300)).unwrap();
        let hosts_bytes = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&hosts).unwrap().blocks() * 512
        };
        assert!(hosts_bytes > 0);
        let figures = |name: &str, used, local_ephemeral| volumes::VolumeFigures {
            name: name.into(),
            pvc: None,
            time: 0,
            capacity: 1 << 30,
            available: 1 << 29,
            used,
            inodes: 100,
            inodes_free: 90,
            inodes_used: 3,
            abnormal: None,
            local_ephemeral,
        };
        state.stats.volume_stats().set(
            "u-1",
            vec![figures("scratch", 1000, true), figures("secret", 7, false)],
        );
        let (code, body) = get(&state, "/stats/summary").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let pods = v["pods"].as_array().unwrap();
        assert_eq!(pods.len(), 1, "only the pod with a running container");
        assert_eq!(pods[0]["podRef"]["name"], "web");
        assert_eq!(pods[0]["containers"][0]["cpu"]["usageNanoCores"], 0);
        assert_eq!(pods[0]["volume"].as_array().unwrap().len(), 2);
        // The container's rootfs, the emptyDir and the hosts file, not the
        // secret.
        assert_eq!(
            pods[0]["ephemeral-storage"]["usedBytes"],
            8192 + 1000 + hosts_bytes
        );
        std::fs::remove_dir_all(&state.root_dir).unwrap();
        assert!(v["node"]["rlimit"]["maxpid"].as_i64().unwrap() > 0);
        for (q, only) in [
            ("only_cpu_and_memory=true", true),
            ("only_cpu_and_memory=1", false),
            ("only_cpu_and_memory=true&only_cpu_and_memory=true", false),
        ] {
            let (_, body) = get(&state, &format!("/stats/summary?{q}")).await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["node"]["fs"].is_null(), only, "{q}");
        }
    }

    #[tokio::test]
    async fn only_cpu_and_memory_leaves_out_fs_and_network() {
        let rt = Arc::new(FakeRuntime::new());
        let (_, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 1, 2, 3);
        let (state, _t) = ServerState::for_tests(rt.clone());
        let (code, body) = get(&state, "/stats/summary?only_cpu_and_memory=true").await;
        assert_eq!(code, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["node"]["fs"].is_null() && v["node"]["network"].is_null());
        assert!(v["node"]["runtime"].is_null());
        let ctr = &v["pods"][0]["containers"][0];
        assert!(ctr["rootfs"].is_null() && ctr["logs"].is_null());
        assert_eq!(ctr["memory"]["workingSetBytes"], 2);
        assert!(v["pods"][0]["ephemeral-storage"].is_null());
    }

    /// A state with one pod and its container's stats, and the task that
    /// collects ahead of steady scrapes running on it.
    async fn collecting_ahead() -> (
        ServerState,
        tokio_util::sync::CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let rt = Arc::new(FakeRuntime::new());
        let (_, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 1, 2, 3);
        let (state, token) = ServerState::for_tests(rt.clone());
        let task = tokio::spawn(collect_ahead(state.clone(), token.child_token()));
        (state, token, task)
    }

    /// Paused time: cAdvisor scrapes every 2 s. From the fifth, the
    /// collection and the text are made ahead; the scrape sends that text
    /// (a marker put in its place shows it), in its own encoding only and
    /// for that snapshot only, and the text is let go a cache life later.
    #[tokio::test(start_paused = true)]
    async fn a_steady_cadvisor_scrape_is_sent_the_text_made_ahead_for_it() {
        let (state, token, task) = collecting_ahead().await;
        let t0 = tokio::time::Instant::now();
        let at = |s: u64| tokio::time::sleep_until(t0 + std::time::Duration::from_secs(s));
        let ready = || state.stats.ahead_text().lock().ready.is_some();
        for s in [0, 2, 4, 6] {
            at(s).await;
            let (code, body) = get(&state, "/metrics/cadvisor").await;
            assert_eq!(code, StatusCode::OK);
            assert!(body.contains("container_cpu_usage_seconds_total"));
            assert!(!ready(), "nothing is made ahead before a period shows");
        }
        // Just before the fifth scrape: made ahead, in the last encoding.
        tokio::time::sleep_until(t0 + std::time::Duration::from_millis(7_990)).await;
        let marker = Bytes::from_static(b"# made ahead\n");
        {
            let mut g = state.stats.ahead_text().lock();
            let (_, enc, cell) = g.ready.as_mut().expect("text made ahead");
            assert_eq!(*enc, encoding::Encoding::Identity);
            let made = cell.get().expect("made before the scrape is due");
            assert!(made.iter().map(|c| c.len()).sum::<usize>() > 1000);
            *cell = Arc::new(tokio::sync::OnceCell::new_with(Some(vec![marker.clone()])));
        }
        at(8).await;
        let (_, body) = get(&state, "/metrics/cadvisor").await;
        assert_eq!(body, "# made ahead\n");
        // Another encoding is rendered for itself.
        let resp = routes()
            .with_state(state.clone())
            .oneshot(
                Request::get("/metrics/cadvisor")
                    .header("accept-encoding", "gzip")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-encoding"], "gzip");
        // Another snapshot too.
        state.stats.expire();
        let (_, body) = get(&state, "/metrics/cadvisor").await;
        assert!(body.contains("container_cpu_usage_seconds_total"));
        // The text is let go a cache life after it was made.
        tokio::time::sleep(provider::CACHE_TTL).await;
        assert!(!ready());
        token.cancel();
        task.await.unwrap();
    }

    /// Two Prometheus servers of an HA pair, 3 s apart on a 15 s period,
    /// one asking for gzip: each client's scrapes are timed apart, and each
    /// is sent the text made ahead for it in its own encoding. Before
    /// scrapes were told apart by client, the pair's 3 s and 12 s intervals
    /// showed no period and every scrape was collected and rendered when it
    /// came.
    #[tokio::test(start_paused = true)]
    async fn each_client_of_an_ha_pair_is_collected_for_ahead() {
        let (state, token, task) = collecting_ahead().await;
        let t0 = tokio::time::Instant::now();
        let at = |ms: u64| tokio::time::sleep_until(t0 + std::time::Duration::from_millis(ms));
        let scrape = |ip: u8, gzip: bool| {
            let mut req = Request::get("/metrics/cadvisor");
            if gzip {
                req = req.header("accept-encoding", "gzip");
            }
            let mut req = req.body(Body::empty()).unwrap();
            let peer = std::net::SocketAddr::from(([10, 0, 0, ip], 40_000));
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let state = state.clone();
            async move {
                let resp = routes().with_state(state).oneshot(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                axum::body::to_bytes(resp.into_body(), 64 << 20)
                    .await
                    .unwrap()
            }
        };
        for k in 0..4 {
            at(15_000 * k).await;
            scrape(1, false).await;
            at(15_000 * k + 3_000).await;
            scrape(2, true).await;
        }
        // Just before each one's fifth scrape, its text is made in its
        // encoding; a marker in its place is what it receives.
        for (ms, ip, gzip) in [(60_000, 1, false), (63_000, 2, true)] {
            at(ms - 10).await;
            let marker = Bytes::from(format!("# made ahead for {ip}\n"));
            {
                let mut g = state.stats.ahead_text().lock();
                let (_, enc, cell) = g.ready.as_mut().expect("text made ahead");
                let want = if gzip {
                    encoding::Encoding::Gzip
                } else {
                    encoding::Encoding::Identity
                };
                assert_eq!(*enc, want, "client {ip}");
                assert!(cell.get().is_some(), "made before the scrape is due");
                *cell = Arc::new(tokio::sync::OnceCell::new_with(Some(vec![marker.clone()])));
            }
            at(ms).await;
            assert_eq!(scrape(ip, gzip).await, marker);
        }
        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn concurrent_scrapes_share_one_collection() {
        let rt = Arc::new(FakeRuntime::new());
        let (_, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 1, 2, 3);
        let (state, _t) = ServerState::for_tests(rt.clone());
        rt.clear_calls();
        // cAdvisor's text reads more than any of these (a collection of its
        // own); it serves all of them in turn.
        let (a, b, c2, d) = tokio::join!(
            get(&state, "/metrics/cadvisor"),
            get(&state, "/stats/summary"),
            get(&state, "/metrics/resource"),
            get(&state, "/stats/summary?only_cpu_and_memory=true"),
        );
        assert!(a.0.is_success() && b.0.is_success() && c2.0.is_success() && d.0.is_success());
        let n = rt
            .calls()
            .iter()
            .filter(|c| *c == "ListContainerStats")
            .count();
        assert_eq!(n, 1, "{:?}", rt.calls());
    }

    #[tokio::test]
    async fn resource_metrics_have_upstream_names_labels_and_timestamps() {
        let rt = Arc::new(FakeRuntime::new());
        let (_, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 2_500_000_000, 4096, 0);
        let (state, _t) = ServerState::for_tests(rt.clone());
        let (code, text) = get(&state, "/metrics/resource").await;
        assert_eq!(code, StatusCode::OK);
        assert!(
            text.contains("# TYPE container_cpu_usage_seconds_total counter"),
            "{text}"
        );
        assert!(text.contains("# TYPE container_memory_working_set_bytes gauge"));
        let s = parse(&text);
        let l = [("container", "app"), ("pod", "web"), ("namespace", "ns1")];
        let cpu = sample(&s, "container_cpu_usage_seconds_total", &l).expect("cpu");
        assert_eq!(value(cpu), 2.5);
        assert_eq!(cpu.labels.len(), 3);
        let ws = sample(&s, "container_memory_working_set_bytes", &l).expect("ws");
        assert_eq!(value(ws), 4096.0);
        assert!(sample(&s, "container_start_time_seconds", &l).is_some());
        let pl = [("pod", "web"), ("namespace", "ns1")];
        assert_eq!(
            value(sample(&s, "pod_cpu_usage_seconds_total", &pl).unwrap()),
            2.5
        );
        assert_eq!(
            value(sample(&s, "pod_memory_working_set_bytes", &pl).unwrap()),
            4096.0
        );
        assert_eq!(
            value(sample(&s, "resource_scrape_error", &[]).unwrap()),
            0.0
        );
        assert_eq!(value(sample(&s, "scrape_error", &[]).unwrap()), 0.0);
        assert!(sample(&s, "node_cpu_usage_seconds_total", &[]).is_some());
        assert!(sample(&s, "node_memory_working_set_bytes", &[]).is_some());
        // CPU and memory samples carry their collection time (ms), the
        // start time does not, as upstream.
        let line = |m: &str| {
            text.lines()
                .find(|l| l.starts_with(m))
                .unwrap()
                .split(' ')
                .count()
        };
        assert_eq!(line("container_cpu_usage_seconds_total{"), 3);
        assert_eq!(line("node_memory_working_set_bytes "), 3);
        assert_eq!(line("container_start_time_seconds{"), 2);
    }

    #[tokio::test]
    async fn a_runtime_error_is_a_scrape_error_not_a_failure() {
        struct Broken;
        #[async_trait::async_trait]
        impl RuntimeService for Broken {
            async fn version(&self) -> crate::cri::CriResult<v1::VersionResponse> {
                Err(crate::cri::unimplemented("Version"))
            }
            async fn status(&self) -> crate::cri::CriResult<v1::StatusResponse> {
                Err(crate::cri::unimplemented("Status"))
            }
            async fn update_runtime_config(&self, _: &str) -> crate::cri::CriResult<()> {
                unreachable!()
            }
            async fn run_pod_sandbox(
                &self,
                _: v1::PodSandboxConfig,
                _: String,
            ) -> crate::cri::CriResult<String> {
                unreachable!()
            }
            async fn stop_pod_sandbox(&self, _: &str) -> crate::cri::CriResult<()> {
                unreachable!()
            }
            async fn remove_pod_sandbox(&self, _: &str) -> crate::cri::CriResult<()> {
                unreachable!()
            }
            async fn pod_sandbox_status(
                &self,
                _: &str,
            ) -> crate::cri::CriResult<v1::PodSandboxStatus> {
                unreachable!()
            }
            async fn list_pod_sandbox(
                &self,
                _: Option<v1::PodSandboxFilter>,
            ) -> crate::cri::CriResult<Vec<v1::PodSandbox>> {
                Err(crate::cri::CriError::Unavailable {
                    op: "ListPodSandbox",
                    message: "down".into(),
                })
            }
            async fn create_container(
                &self,
                _: &str,
                _: v1::ContainerConfig,
                _: v1::PodSandboxConfig,
            ) -> crate::cri::CriResult<String> {
                unreachable!()
            }
            async fn start_container(&self, _: &str) -> crate::cri::CriResult<()> {
                unreachable!()
            }
            async fn stop_container(&self, _: &str, _: i64) -> crate::cri::CriResult<()> {
                unreachable!()
            }
            async fn remove_container(&self, _: &str) -> crate::cri::CriResult<()> {
                unreachable!()
            }
            async fn list_containers(
                &self,
                _: Option<v1::ContainerFilter>,
            ) -> crate::cri::CriResult<Vec<v1::Container>> {
                Ok(vec![])
            }
            async fn container_status(
                &self,
                _: &str,
            ) -> crate::cri::CriResult<v1::ContainerStatus> {
                unreachable!()
            }
            async fn exec_sync(
                &self,
                _: &str,
                _: Vec<String>,
                _: i64,
            ) -> crate::cri::CriResult<v1::ExecSyncResponse> {
                unreachable!()
            }
            async fn container_events(
                &self,
                _: tokio::sync::mpsc::Sender<v1::ContainerEventResponse>,
            ) -> crate::cri::CriResult<()> {
                unreachable!()
            }
        }
        let fake = Arc::new(FakeRuntime::new());
        let (mut state, _t) = ServerState::for_tests(fake);
        state.runtime = Arc::new(Broken);
        let (code, text) = get(&state, "/metrics/resource").await;
        assert_eq!(code, StatusCode::OK);
        let s = parse(&text);
        assert_eq!(
            value(sample(&s, "resource_scrape_error", &[]).unwrap()),
            1.0
        );
        let (code, _) = get(&state, "/stats/summary").await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
    }

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    /// A v1 tree with the pod's, its sandbox's and its container's cgroups.
    fn fake_tree(root: &Path, sb: &str, c: &str) {
        let pod = "kubepods/besteffort/podu-1";
        for (cg, cpu, usage) in [
            ("", 9_000_000_000u64, 1u64 << 30),
            ("kubepods", 3_000_000_000, 1 << 24),
            ("kubepods/besteffort", 3_000_000_000, 1 << 24),
            (pod, 3_000_000_000, 1 << 22),
            (&format!("{pod}/{sb}"), 1_000_000, 1 << 16),
            (&format!("{pod}/{c}"), 2_000_000_000, 1 << 21),
        ] {
            let acct = root.join("cpuacct").join(cg);
            write(&acct, "cpuacct.usage", &format!("{cpu}\n"));
            write(&acct, "cpuacct.stat", "user 100\nsystem 50\n");
            write(&root.join("cpu").join(cg), "cpu.shares", "2\n");
            let mem = root.join("memory").join(cg);
            write(&mem, "memory.usage_in_bytes", &format!("{usage}\n"));
            write(
                &mem,
                "memory.stat",
                "total_inactive_file 1024\ntotal_rss 4096\ntotal_cache 2048\n",
            );
            write(&mem, "memory.limit_in_bytes", "9223372036854771712\n");
            write(&mem, "memory.memsw.limit_in_bytes", "9223372036854771712\n");
        }
        // The container's memory and swap limit (v1's swap limit).
        let ctr_mem = root.join("memory").join(pod).join(c);
        write(&ctr_mem, "memory.memsw.limit_in_bytes", "52428800\n");
        write(
            &ctr_mem,
            "memory.memsw.usage_in_bytes",
            &format!("{}\n", (1u64 << 21) + 4096),
        );
        // The container's two processes (of many threads, as pids.current
        // would count them).
        write(
            &root.join("cpu").join(pod).join(c),
            "cgroup.procs",
            &format!("{}\n1\n", std::process::id()),
        );
        // The pause process: this test process, so its netns is readable.
        write(
            &root.join("memory").join(pod).join(sb),
            "cgroup.procs",
            &format!("{}\n", std::process::id()),
        );
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "rkubelet-stats-mod-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn fake_hierarchy(root: &Path) -> cgroup::Hierarchy {
        cgroup::Hierarchy::V1 {
            roots: ["cpu", "cpuacct", "memory"]
                .iter()
                .map(|n| (n.to_string(), root.join(n)))
                .collect(),
            unified: None,
        }
    }

    /// cAdvisor's collection reads its pods in two halves, through two
    /// readers on two threads (`provider::read_files`): every pod's figures
    /// come out, each from its own cgroup, and again (through the files
    /// kept open) at the next collection.
    #[tokio::test]
    async fn a_collection_in_two_halves_reads_every_pod_once() {
        let rt = Arc::new(FakeRuntime::new());
        let root = tempdir();
        const PODS: u64 = 24;
        let cpu_of = |i: u64, round: u64| 1_000_000_000 * (i + 1) + round;
        let write_cpu = |pod: &str, c: &str, i: u64, round: u64| {
            write(
                &root.join("cpuacct").join(pod).join(c),
                "cpuacct.usage",
                &format!("{}\n", cpu_of(i, round)),
            );
        };
        let mut ids = Vec::new();
        for i in 0..PODS {
            let uid = format!("uid-{i}");
            let (sb, c) = add_pod(&rt, &format!("p{i}"), "ns", &uid, "img").await;
            let pod = format!("kubepods/besteffort/pod{uid}");
            for cg in [pod.clone(), format!("{pod}/{sb}"), format!("{pod}/{c}")] {
                let mem = root.join("memory").join(&cg);
                write(&mem, "memory.usage_in_bytes", "4096\n");
                write(&mem, "memory.stat", "total_inactive_file 0\n");
                write(&root.join("cpuacct").join(&cg), "cpuacct.usage", "1\n");
            }
            write_cpu(&pod, &c, i, 0);
            ids.push((pod, c));
        }
        let (mut state, _t) = ServerState::for_tests(rt.clone());
        state.stats = StatsProvider::with_hierarchy(fake_hierarchy(&root));
        for round in 0..2 {
            if round == 1 {
                for (i, (pod, c)) in ids.iter().enumerate() {
                    write_cpu(pod, c, i as u64, 1);
                }
                state.stats.expire();
            }
            let (_, text) = get(&state, "/metrics/cadvisor").await;
            let scrape = parse(&text);
            for (i, (_, c)) in ids.iter().enumerate() {
                let pod = format!("p{i}");
                let got = sample(
                    &scrape,
                    "container_cpu_usage_seconds_total",
                    &[("pod", pod.as_str()), ("container", "app")],
                )
                .map(value);
                let want = cpu_of(i as u64, round) as f64 / 1e9;
                assert_eq!(got, Some(want), "round {round}, pod {pod} ({c})");
            }
            let (_, body) = get(&state, "/stats/summary").await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let names: Vec<String> = v["pods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["podRef"]["name"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(names.len(), PODS as usize, "{names:?}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn writable_layers_come_from_a_cache_refreshed_in_the_background() {
        let rt = Arc::new(FakeRuntime::new());
        let (sb, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 1, 1, 77);
        let root = tempdir();
        fake_tree(&root, &sb, &c);
        let stats = StatsProvider::with_hierarchy(fake_hierarchy(&root));
        let src = provider::Sources {
            runtime: rt.clone(),
            images: rt.clone(),
            pleg: None,
        };
        let full = |stats: &StatsProvider| {
            stats.expire();
            let (stats, src) = (stats.clone(), src.clone());
            async move {
                stats
                    .snapshot(src, StatsConfig::default(), cgroup::Detail::Full)
                    .await
                    .unwrap()
            }
        };
        let rootfs = |s: &Arc<provider::Snapshot>| s.pods[0].containers[0].rootfs;
        let asked = || {
            rt.calls()
                .iter()
                .filter(|c| *c == "ListContainerStats")
                .count()
        };
        rt.clear_calls();
        // The first full scrape waits for the runtime's figures.
        assert_eq!(rootfs(&full(&stats).await), Some((Some(77), None)));
        assert_eq!(asked(), 1);
        // The next ones are served from the cache.
        rt.set_container_stats(&c, 1, 1, 99);
        assert_eq!(rootfs(&full(&stats).await), Some((Some(77), None)));
        assert_eq!(asked(), 1);
        // Once the period has passed, a scrape does not wait for the
        // runtime (it answers from the cache unless the refresh it started
        // has landed meanwhile); later scrapes see the refresh.
        stats.age_disk(provider::DISK_PERIOD);
        let r = rootfs(&full(&stats).await);
        assert!(
            r == Some((Some(77), None)) || r == Some((Some(99), None)),
            "{r:?}"
        );
        for _ in 0..200 {
            if asked() == 2 && !stats.refreshing() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(asked(), 2);
        assert_eq!(rootfs(&full(&stats).await), Some((Some(99), None)));
        assert_eq!(asked(), 2);
        // The cpu-and-memory forms never ask when every cgroup is found.
        stats.expire();
        for d in [cgroup::Detail::Resource, cgroup::Detail::CpuMemory] {
            stats.expire();
            let s = stats
                .snapshot(src.clone(), StatsConfig::default(), d)
                .await
                .unwrap();
            assert_eq!(s.pods[0].containers[0].rootfs, None);
        }
        assert_eq!(asked(), 2);
        let _ = std::fs::remove_dir_all(root);
    }

    #[tokio::test]
    async fn resource_snapshots_read_cpu_and_memory_only_and_keep_system_rates() {
        let rt = Arc::new(FakeRuntime::new());
        let (sb, c) = fake_pod(&rt).await;
        let root = tempdir();
        fake_tree(&root, &sb, &c);
        let stats = StatsProvider::with_hierarchy(fake_hierarchy(&root));
        let src = provider::Sources {
            runtime: rt.clone(),
            images: rt.clone(),
            pleg: None,
        };
        let snap = |d| {
            stats.expire();
            stats.snapshot(src.clone(), StatsConfig::default(), d)
        };
        let r = snap(cgroup::Detail::Resource).await.unwrap();
        assert!(r.system.is_empty() && r.hierarchy.is_empty());
        let ctr = &r.pods[0].containers[0];
        assert_eq!(ctr.sample.cpu.unwrap().usage_ns, 2_000_000_000);
        assert_eq!(ctr.sample.memory.unwrap().working_set, (1 << 21) - 1024);
        assert_eq!(
            ctr.sample.cpu_shares, None,
            "cAdvisor's figures are not read"
        );
        assert!(r.pods[0].sandbox_cgroup.is_none());
        // The full summary: no sandbox or QoS cgroup figures, but the pod's
        // network through its sandbox's pause process.
        let sum = snap(cgroup::Detail::Summary).await.unwrap();
        assert!(sum.hierarchy.is_empty() && !sum.system.is_empty());
        assert!(sum.pods[0].sandbox_cgroup.is_none());
        assert!(!sum.pods[0].interfaces.is_empty());
        assert_eq!(sum.pods[0].containers[0].sample.cpu_shares, None);
        let f = snap(cgroup::Detail::Full).await.unwrap();
        assert_eq!(f.pods[0].containers[0].sample.cpu_shares, Some(2));
        assert!(f.pods[0].sandbox_cgroup.is_some());
        assert_eq!(f.hierarchy.len(), 3, "/, kubepods, besteffort");
        assert_eq!(
            f.pods[0].containers[0].image,
            "docker.io/library/busybox:1.36"
        );
        let _ = std::fs::remove_dir_all(root);
    }

    /// The KubeletPSI gate (on by default, as upstream's beta) decides
    /// whether the summary has PSI and cAdvisor's text its
    /// `container_pressure_*` families (upstream's summary provider and
    /// cAdvisor collector both check it).
    #[tokio::test]
    async fn the_psi_gate_decides_whether_pressure_is_shown() {
        let rt = Arc::new(FakeRuntime::new());
        let (sb, c) = fake_pod(&rt).await;
        let root = tempdir();
        fake_tree(&root, &sb, &c);
        let line = "some avg10=0.00 avg60=0.00 avg300=0.00 total=3000000\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n";
        let ctr = format!("kubepods/besteffort/podu-1/{c}");
        for f in ["cpu.pressure", "memory.pressure", "io.pressure"] {
            write(&root.join("unified").join(&ctr), f, line);
        }
        let h = cgroup::Hierarchy::V1 {
            roots: ["cpu", "cpuacct", "memory"]
                .iter()
                .map(|n| (n.to_string(), root.join(n)))
                .collect(),
            unified: Some(root.join("unified")),
        };
        let (mut state, _t) = ServerState::for_tests(rt.clone());
        for gate in [None, Some(false)] {
            let mut cfg = crate::config::KubeletConfiguration::default();
            if let Some(on) = gate {
                cfg.feature_gates.insert("KubeletPSI".into(), on);
            }
            state.config = Arc::new(cfg);
            state.stats = StatsProvider::with_hierarchy(h.clone());
            let shown = gate.is_none();
            let (_, body) = get(&state, "/stats/summary").await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let cpu = &v["pods"][0]["containers"][0]["cpu"];
            assert_eq!(cpu["usageCoreNanoSeconds"], 2_000_000_000u64, "{cpu}");
            let total = &cpu["psi"]["full"]["total"];
            assert_eq!(total.as_u64(), shown.then_some(1_000_000), "{cpu}");
            let (_, text) = get(&state, "/metrics/cadvisor").await;
            let stalled = sample(
                &parse(&text),
                "container_pressure_cpu_stalled_seconds_total",
                &[("container", "app")],
            )
            .map(value);
            assert_eq!(stalled, shown.then_some(1.0), "gate {gate:?}");
            assert_eq!(text.contains("container_pressure_"), shown);
            assert!(text.contains("container_cpu_usage_seconds_total{container=\"app\""));
        }
        let _ = std::fs::remove_dir_all(root);
    }

    #[tokio::test]
    async fn cgroup_figures_drive_summary_and_cadvisor_labels() {
        let rt = Arc::new(FakeRuntime::new());
        let (sb, c) = fake_pod(&rt).await;
        rt.set_container_stats(&c, 1, 1, 77);
        let root = tempdir();
        fake_tree(&root, &sb, &c);
        let h = cgroup::Hierarchy::V1 {
            roots: ["cpu", "cpuacct", "memory"]
                .iter()
                .map(|n| (n.to_string(), root.join(n)))
                .collect(),
            unified: None,
        };
        let (mut state, _t) = ServerState::for_tests(rt.clone());
        // Every cgroup found: the cpu-and-memory form costs the runtime no
        // ListContainerStats.
        state.stats = StatsProvider::with_hierarchy(h.clone());
        rt.clear_calls();
        let (_, text) = get(&state, "/metrics/resource").await;
        assert!(text.contains("container_cpu_usage_seconds_total{container=\"app\""));
        // Upstream's container_swap_limit_bytes: available plus usage, only
        // under a swap limit.
        let res = parse(&text);
        let swap_limit = sample(&res, "container_swap_limit_bytes", &[("container", "app")]);
        assert_eq!(swap_limit.map(value), Some(52428800.0), "{text}");
        // The tree's swap usage file, unless this host has no swap (then
        // nothing is swapped out and the file is not read).
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let host_swap = procfs::parse_meminfo(&meminfo).swap_total > 0;
        assert_eq!(
            sample(&res, "container_swap_usage_bytes", &[("container", "app")]).map(value),
            Some(if host_swap { 4096.0 } else { 0.0 })
        );
        assert!(
            !rt.calls().iter().any(|c| c == "ListContainerStats"),
            "{:?}",
            rt.calls()
        );
        // A fresh provider, so the full summary below is a new collection;
        // one OOM kill in the container's cgroup.
        state.stats = StatsProvider::with_hierarchy_and_oom(h);
        state.stats.oom_counts().unwrap().record(&oom::OomKill {
            oom_memcg: format!("/kubepods/besteffort/podu-1/{c}"),
            task_memcg: format!("/kubepods/besteffort/podu-1/{c}"),
            task: "app".into(),
            pid: 1,
        });
        let (_, body) = get(&state, "/stats/summary").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let pod = &v["pods"][0];
        // Cgroup figures win over the CRI's for cpu and memory.
        assert_eq!(
            pod["containers"][0]["cpu"]["usageCoreNanoSeconds"],
            2_000_000_000u64
        );
        assert_eq!(
            pod["containers"][0]["memory"]["workingSetBytes"],
            (1u64 << 21) - 1024
        );
        assert_eq!(pod["containers"][0]["memory"]["rssBytes"], 4096);
        assert_eq!(pod["containers"][0]["rootfs"]["usedBytes"], 77);
        // swapAvailableBytes under a limit only (the pod has none).
        let swapped = if host_swap { 4096 } else { 0 };
        assert_eq!(pod["containers"][0]["swap"]["swapUsageBytes"], swapped);
        assert_eq!(
            pod["containers"][0]["swap"]["swapAvailableBytes"],
            52428800 - swapped
        );
        assert!(pod["swap"]["swapAvailableBytes"].is_null(), "{pod}");
        assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 3_000_000_000u64);
        assert_eq!(pod["memory"]["workingSetBytes"], (1u64 << 22) - 1024);
        // Upstream's addProcessStats: its containers' processes (not the
        // pod cgroup's threads, nor the pause process).
        assert_eq!(pod["process_stats"]["process_count"], 2, "{pod}");
        assert!(pod["network"]["time"].is_string(), "{pod}");
        assert_eq!(v["node"]["cpu"]["usageCoreNanoSeconds"], 9_000_000_000u64);
        let names: Vec<&str> = v["node"]["systemContainers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert!(names.contains(&"pods"), "{names:?}");

        let (_, text) = get(&state, "/metrics/cadvisor").await;
        let s = parse(&text);
        let id = format!("/kubepods/besteffort/podu-1/{c}");
        let ctr = sample(
            &s,
            "container_memory_working_set_bytes",
            &[
                ("id", id.as_str()),
                ("name", c.as_str()),
                ("image", "docker.io/library/busybox:1.36"),
                ("pod", "web"),
                ("namespace", "ns1"),
                ("container", "app"),
            ],
        )
        .expect("container sample");
        assert_eq!(value(ctr), ((1u64 << 21) - 1024) as f64);
        let cpu = sample(
            &s,
            "container_cpu_usage_seconds_total",
            &[("id", id.as_str()), ("cpu", "total")],
        )
        .expect("cpu");
        assert_eq!(value(cpu), 2.0);
        assert_eq!(cpu.labels.len(), 7);
        // The pod cgroup: pod and namespace, no container or name.
        let pod_cg = sample(
            &s,
            "container_memory_usage_bytes",
            &[
                ("id", "/kubepods/besteffort/podu-1"),
                ("pod", "web"),
                ("container", ""),
                ("name", ""),
            ],
        );
        assert!(pod_cg.is_some());
        // The sandbox carries the pod's network.
        let sb_id = format!("/kubepods/besteffort/podu-1/{sb}");
        assert!(s
            .samples
            .iter()
            .any(|x| x.metric == "container_network_receive_bytes_total"
                && x.labels.get("id") == Some(sb_id.as_str())
                && x.labels.get("interface").is_some()));
        assert!(sample(
            &s,
            "container_spec_memory_limit_bytes",
            &[("id", id.as_str())]
        )
        .is_some());
        // cAdvisor's spec families: unlimited is 0.
        let spec = |name: &str, id: &str| sample(&s, name, &[("id", id)]).map(value);
        let swap = "container_spec_memory_swap_limit_bytes";
        assert_eq!(spec(swap, &id), Some(52428800.0));
        assert_eq!(spec(swap, "/kubepods/besteffort/podu-1"), Some(0.0));
        assert_eq!(
            spec("container_spec_memory_reservation_limit_bytes", &id),
            Some(0.0),
            "no soft limit file: 0"
        );
        assert!(sample(&s, "container_cpu_usage_seconds_total", &[("id", "/")]).is_some());
        assert!(sample(&s, "machine_cpu_cores", &[]).is_some());
        let oom = |id: &str| sample(&s, "container_oom_events_total", &[("id", id)]).map(value);
        assert_eq!(oom(&id), Some(1.0));
        assert_eq!(oom("/kubepods/besteffort/podu-1"), Some(0.0));
        let _ = std::fs::remove_dir_all(root);
    }
}
