//! rkubelet-bench: measures rkubelet against a bare CRI client on the
//! machine's containerd, and prints figures (never asserts on them).
//!
//! For each pod count N it reports:
//! - bare CRI: RunPodSandbox + CreateContainer + StartContainer for N pods
//!   at once, p50/p99 per pod and the wall time;
//! - rkubelet: N manifests written at once, time until each pod's container
//!   shows running on /pods, p50/p99 and wall, and the ratio to bare CRI;
//! - rkubelet's RSS and CPU seconds over an idle window with the N pods;
//! - how long a killed container takes to show on /pods (p50/p99).
//!
//! With `--cluster 1,30,110`, cluster mode against the in-process API
//! server double (`tests/common/apiserver`, a double of the Kubernetes API,
//! not a real one): time from N pods bound to the node to each one's Running
//! status observed through a watch, beside bare CRI; API requests per minute
//! at steady state by kind; rkubelet's RSS and CPU with the N API pods.
//!
//! With `--scrape 1,30`, the stats endpoints with N pods: latency, body
//! size and the CPU rkubelet and containerd spend per `/metrics/cadvisor`,
//! `/metrics/resource` and `/stats/summary` scrape (each past the 1 s cache;
//! the metric endpoints plain and gzipped; steady scrapes, which rkubelet
//! collects for ahead, and the latency at irregular gaps, which it
//! collects for when asked), the latency of an HA pair's scrapes (two
//! client addresses, each on its own clock), the kernel's floor for those
//! collections (the CPU of reading, once per scrape gap, the cgroup files
//! rkubelet keeps open; see `kernel_floor`), then a minute of
//! `/metrics/resource` every 15 s (metrics-server) and one with
//! `/metrics/cadvisor` beside it (Prometheus), gzipped as those clients ask:
//! CPU per minute; and the
//! latency of a cAdvisor scrape made during a resource scrape's collection.
//!
//! With `--render 110` (and nothing else: no containerd needed), the CPU
//! and wall time of rendering `/metrics/cadvisor`'s text from a synthetic
//! snapshot of N one-container pods shaped like the lab's (and 334 root
//! file systems, as a kubelet started beside running pods lists): the
//! renderer's own cost, without the kernel's reads or the network.
//!
//! With `--exec 200`, exec latency through rkubelet's :10250 beside a
//! direct CRI exec (crictl's path): a whole exec of `true`, and an echo
//! round trip in an open session (see `bench/exec.rs`).
//!
//! Needs root and containerd set up by scripts/setup.sh; stop any other
//! kubelet first (scripts/stop-rkubelet.sh).

#[allow(dead_code)]
#[path = "../../tests/common/apiserver/mod.rs"]
mod apiserver;
#[path = "bench/exec.rs"]
mod exec;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rkubelet::cri::client::RemoteRuntime;
use rkubelet::cri::v1;
use rkubelet::cri::{ImageService, RuntimeService};
use serde_json::Value;

const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const IMAGE: &str = "docker.io/library/busybox:1.36";

struct Args {
    pods: Vec<usize>,
    probe_pods: usize,
    flips: usize,
    idle: Duration,
    kills: usize,
    rkubelet: PathBuf,
    storm: usize,
    settle: Duration,
    cluster: Vec<usize>,
    scrape: Vec<usize>,
    scrapes: usize,
    volumes: Vec<usize>,
    exec: u32,
    render: usize,
}

fn parse_args() -> Result<Args> {
    let exe = std::env::current_exe()?;
    let mut a = Args {
        pods: vec![1, 30, 110],
        probe_pods: 0,
        flips: 20,
        idle: Duration::from_secs(60),
        kills: 20,
        rkubelet: exe.with_file_name("rkubelet"),
        storm: 0,
        settle: Duration::from_secs(60),
        cluster: Vec::new(),
        scrape: Vec::new(),
        scrapes: 10,
        volumes: Vec::new(),
        exec: 0,
        render: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (k, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut val = || {
            inline
                .clone()
                .or_else(|| it.next())
                .with_context(|| format!("{k} needs a value"))
        };
        match k.as_str() {
            "--pods" => {
                a.pods = val()?
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty() && *s != "none")
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            "--idle-secs" => a.idle = Duration::from_secs(val()?.parse()?),
            "--kills" => a.kills = val()?.parse()?,
            "--probe-pods" => a.probe_pods = val()?.parse()?,
            "--flips" => a.flips = val()?.parse()?,
            "--rkubelet" => a.rkubelet = PathBuf::from(val()?),
            "--storm" => a.storm = val()?.parse()?,
            "--settle-secs" => a.settle = Duration::from_secs(val()?.parse()?),
            "--cluster" => {
                a.cluster = val()?
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            "--scrape" => {
                a.scrape = val()?
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            "--scrapes" => a.scrapes = val()?.parse()?,
            "--exec" => a.exec = val()?.parse()?,
            "--render" => a.render = val()?.parse()?,
            "--volumes" => {
                a.volumes = val()?
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!("usage: rkubelet-bench [--pods 1,30,110] [--idle-secs 60] [--kills 20] [--rkubelet PATH]\n  --kills N: kill the main container of N distinct pods and time its death on /pods\n  --probe-pods N [--flips F]: N httpd pods with readiness (httpGet) and liveness (tcpSocket)\n    probes every second: rkubelet CPU/RSS, containerd's CPU apart, and the delay from a\n    readiness change to the pod's Ready condition on /pods over F flips\n  --storm N [--settle-secs 60]: a canary pod, then N malformed manifests written and removed:\n    rkubelet's idle, peak and settled RSS\n  --cluster 1,30,110: cluster mode against the API server double: bound pod to Running\n    through a watch vs bare CRI, API requests/min at steady state, RSS and CPU\n  --scrape 1,30 [--scrapes 10]: with N pods, the latency, body size and CPU (rkubelet's\n    and containerd's) of one /metrics/cadvisor, /metrics/resource and /stats/summary\n    scrape, each taken after the 1 s stats cache has expired (the metric endpoints plain\n    and gzipped; steady scrapes, collected for ahead from the fifth, then irregular ones,\n    collected for when asked); an HA pair of clients (127.0.0.1 and .2) on cAdvisor and resource;\n    the kernel's floor (CPU to read the cgroup files rkubelet holds\n    open, once per scrape gap); then CPU per minute with /metrics/resource (and /metrics/cadvisor)\n    scraped every 15 s with gzip, and a cAdvisor scrape\n    made during a resource scrape\n  --render 110: alone, the CPU and wall time of rendering /metrics/cadvisor from a synthetic\n    N-pod snapshot (no containerd)\n  --volumes 110: bound-to-Running with 10 configMap/secret volumes vs none, then N pods with a\n    projected token and a shared configMap: RSS, object watches and TokenRequests");
                std::process::exit(0);
            }
            other => bail!("unknown flag: {other}"),
        }
    }
    Ok(a)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let idx = ((p / 100.0) * (v.len() as f64 - 1.0)).round() as usize;
    v[idx.min(v.len() - 1)]
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    http_get_as(addr, path, false).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The body of a 200 answer to GET `path`, as sent: gzipped when `gzip`
/// asks for it (as Prometheus and Go's HTTP clients, metrics-server's
/// among them, do).
fn http_get_as(addr: &str, path: &str, gzip: bool) -> Option<Vec<u8>> {
    let s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    http_request(s, addr, path, gzip)
}

/// `http_get_as` from source address `from`: two clients on one host, as
/// the two Prometheus servers of an HA pair are to the kubelet (std's
/// TcpStream cannot bind before it connects; tokio's socket can).
fn http_get_from(from: std::net::IpAddr, addr: &str, path: &str, gzip: bool) -> Option<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let to: std::net::SocketAddr = addr.parse().ok()?;
    let s = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().ok()?;
        sock.bind((from, 0).into()).ok()?;
        let c = tokio::time::timeout(Duration::from_secs(2), sock.connect(to));
        c.await.ok()?.ok()
    })?;
    let s = s.into_std().ok()?;
    s.set_nonblocking(false).ok()?;
    http_request(s, addr, path, gzip)
}

fn http_request(mut s: TcpStream, addr: &str, path: &str, gzip: bool) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let accept = if gzip {
        "Accept-Encoding: gzip\r\n"
    } else {
        ""
    };
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let ok = head.contains(" 200 ")
        && (!gzip || head.to_ascii_lowercase().contains("content-encoding: gzip"));
    ok.then(|| buf[end + 4..].to_vec())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// /proc/<pid>: (RSS bytes, CPU seconds user+system).
fn proc_usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (rss, ticks / 100.0)
}

/// /proc/<pid>: (user, system) CPU seconds, to tell our code from the
/// kernel work (TCP connects for probes) done on our behalf.
fn cpu_split(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    (
        f.get(11).copied().unwrap_or(0.0) / 100.0,
        f.get(12).copied().unwrap_or(0.0) / 100.0,
    )
}

struct Kubelet {
    child: Child,
    dir: PathBuf,
    manifests: PathBuf,
    ro: String,
    /// The authenticated port (:10250's stand-in), TLS.
    api: String,
}

impl Kubelet {
    fn start(bin: &Path) -> Result<Self> {
        Self::start_with(bin, &[])
    }

    fn start_with(bin: &Path, extra: &[String]) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("rkubelet-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let (ro, hz, api) = (free_port(), free_port(), free_port());
        let cfg = dir.join("config.yaml");
        std::fs::write(&cfg, format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\nreadOnlyPort: {ro}\naddress: 127.0.0.1\nport: {api}\nhealthzPort: {hz}\nfailSwapOn: false\nauthentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n", manifests.display()))?;
        let log = std::fs::File::create(dir.join("rkubelet.log"))?;
        let child = Command::new(bin)
            .args([
                "--config",
                cfg.to_str().unwrap(),
                "--hostname-override",
                "bench",
                "--root-dir",
            ])
            .arg(dir.join("root"))
            .arg(format!("--cert-dir={}", dir.join("pki").display()))
            .args(extra)
            // Profiling: more flags for every kubelet started (`--v=4` logs
            // each stats collection's files and CPU).
            .args(
                std::env::var("RKUBELET_BENCH_KUBELET_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let k = Kubelet {
            child,
            dir,
            manifests,
            ro: format!("127.0.0.1:{ro}"),
            api: format!("127.0.0.1:{api}"),
        };
        let hz = format!("127.0.0.1:{hz}");
        wait(Duration::from_secs(30), || {
            http_get(&hz, "/healthz").map(|_| ())
        })
        .context("rkubelet healthz")?;
        Ok(k)
    }

    fn pods(&self) -> Vec<Value> {
        http_get(&self.ro, "/pods")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        // Profiling: the kubelet's log, appended where asked.
        if let Ok(to) = std::env::var("RKUBELET_BENCH_KEEP_LOG") {
            if let (Ok(log), Ok(mut out)) = (
                std::fs::read(self.dir.join("rkubelet.log")),
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(to),
            ) {
                use std::io::Write;
                let _ = out.write_all(&log);
            }
        }
        // The killed kubelet's pod volume mounts would stay on the host.
        rkubelet::volume::subpath::detach_all_below(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn manifest(name: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sleep, '3600']\n")
}

fn running_main(p: &Value) -> Option<String> {
    let c = p["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "main")?;
    c["state"]["running"]
        .is_object()
        .then(|| c["containerID"].as_str().unwrap_or_default().to_string())
}

struct KubeletFigures {
    per_pod: Vec<f64>,
    wall: f64,
}

/// Writes N manifests at once and times each pod to running on /pods.
fn kubelet_start_pods(k: &Kubelet, n: usize) -> Result<KubeletFigures> {
    let t0 = Instant::now();
    for i in 0..n {
        std::fs::write(
            k.manifests.join(format!("p{i}.yaml")),
            manifest(&format!("p{i}")),
        )?;
    }
    let mut done: HashMap<String, f64> = HashMap::new();
    wait(Duration::from_secs(300), || {
        let el = t0.elapsed().as_secs_f64();
        for p in k.pods() {
            if running_main(&p).is_some() {
                let name = p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                done.entry(name).or_insert(el);
            }
        }
        (done.len() >= n).then_some(())
    })?;
    let per_pod: Vec<f64> = done.values().copied().collect();
    let wall = per_pod.iter().cloned().fold(0.0, f64::max);
    Ok(KubeletFigures { per_pod, wall })
}

fn bare_sandbox(i: usize, uid: &str) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: format!("bare{i}"),
            uid: uid.into(),
            namespace: "bench".into(),
            attempt: 0,
        }),
        hostname: format!("bare{i}"),
        // Outside the kubelet's podLogsDir: its log cleanup takes the
        // directories of pods it does not know.
        log_directory: format!("{BARE_LOGS}/bench_bare{i}_{uid}"),
        labels: HashMap::from([("rkubelet-bench".to_string(), "bare".to_string())]),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The same work without a kubelet: sandbox, create, start, N at once.
async fn bare_cri(cri: &RemoteRuntime, n: usize, image_ref: &str) -> Result<(Vec<f64>, f64)> {
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let cri = cri.clone();
        let image_ref = image_ref.to_string();
        set.spawn(async move {
            let uid = format!("bench-bare-{}-{i}", std::process::id());
            let sb = bare_sandbox(i, &uid);
            std::fs::create_dir_all(&sb.log_directory).ok();
            let id = cri.run_pod_sandbox(sb.clone(), String::new()).await?;
            let cfg = v1::ContainerConfig {
                metadata: Some(v1::ContainerMetadata {
                    name: "main".into(),
                    attempt: 0,
                }),
                image: Some(v1::ImageSpec {
                    image: image_ref,
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                log_path: "main/0.log".into(),
                labels: HashMap::from([("rkubelet-bench".to_string(), "bare".to_string())]),
                ..Default::default()
            };
            let c = cri.create_container(&id, cfg, sb).await?;
            cri.start_container(&c).await?;
            Ok::<f64, rkubelet::cri::CriError>(t0.elapsed().as_secs_f64())
        });
    }
    let mut per = Vec::new();
    while let Some(r) = set.join_next().await {
        per.push(r??);
    }
    let wall = t0.elapsed().as_secs_f64();
    Ok((per, wall))
}

/// Where the bare CRI pods' logs go.
const BARE_LOGS: &str = "/var/log/rkubelet-bench";

async fn remove_bare(cri: &RemoteRuntime) {
    for s in cri.list_pod_sandbox(None).await.unwrap_or_default() {
        if s.labels.contains_key("rkubelet-bench") {
            let _ = cri.stop_pod_sandbox(&s.id).await;
            let _ = cri.remove_pod_sandbox(&s.id).await;
        }
    }
    let _ = tokio::fs::remove_dir_all(BARE_LOGS).await;
}

/// CPU seconds of every containerd and shim process: the runtime's share.
fn runtime_cpu() -> f64 {
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.starts_with("containerd") {
            total += proc_usage(pid).1;
        }
    }
    total
}

fn probed_manifest(name: &str, www: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [httpd, -f, -p, '8080', -h, /www]\n    readinessProbe:\n      httpGet: {{path: /ready, port: 8080}}\n      periodSeconds: 1\n      failureThreshold: 1\n    livenessProbe:\n      tcpSocket: {{port: 8080}}\n      periodSeconds: 1\n    volumeMounts: [{{name: www, mountPath: /www}}]\n  volumes:\n  - name: www\n    hostPath: {{path: {}}}\n",
        www.display()
    )
}

fn ready_condition(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Probed pods in steady state, then readiness flips timed on /pods.
fn probe_bench(args: &Args, cri: &RemoteRuntime) -> Result<()> {
    let n = args.probe_pods;
    println!("\n== {n} probed pod(s): readiness httpGet + liveness tcpSocket, periodSeconds 1 ==");
    let k = Kubelet::start(&args.rkubelet)?;
    let www = k.dir.join("www");
    for i in 0..n {
        let dir = www.join(format!("q{i}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("ready"), "ok")?;
        std::fs::write(
            k.manifests.join(format!("q{i}.yaml")),
            probed_manifest(&format!("q{i}"), &dir),
        )?;
    }
    wait(Duration::from_secs(600), || {
        (k.pods().iter().filter(|p| ready_condition(p)).count() >= n).then_some(())
    })?;
    let pid = k.child.id();
    let (_, cpu0) = proc_usage(pid);
    let (u0, s0) = cpu_split(pid);
    let rt0 = runtime_cpu();
    std::thread::sleep(args.idle);
    let (rss, cpu1) = proc_usage(pid);
    let (u1, s1) = cpu_split(pid);
    let rt1 = runtime_cpu();
    let secs = args.idle.as_secs_f64();
    println!(
        "steady {}s: rkubelet RSS {:.1} MiB, CPU {:.2}s = {:.2}% of one core; containerd+shims CPU {:.2}s = {:.2}%",
        args.idle.as_secs(),
        rss as f64 / 1048576.0,
        cpu1 - cpu0,
        100.0 * (cpu1 - cpu0) / secs,
        rt1 - rt0,
        100.0 * (rt1 - rt0) / secs
    );
    println!(
        "  rkubelet CPU split: user {:.2}s, system {:.2}s",
        u1 - u0,
        s1 - s0
    );
    let mut delays = Vec::new();
    for f in 0..args.flips {
        // Each pod goes unready, then ready again.
        let i = (f / 2) % n;
        let name = format!("q{i}-bench");
        let ready_file = www.join(format!("q{i}")).join("ready");
        let want_ready = f % 2 == 1;
        // Spread the changes over the probe period: a change made right
        // after the previous flip was seen would always wait a full period.
        std::thread::sleep(Duration::from_millis((f as u64 * 370) % 1000));
        let t0 = Instant::now();
        if want_ready {
            std::fs::write(&ready_file, "ok")?;
        } else {
            std::fs::remove_file(&ready_file)?;
        }
        wait(Duration::from_secs(30), || {
            k.pods()
                .iter()
                .find(|p| p["metadata"]["name"] == name.as_str())
                .filter(|p| ready_condition(p) == want_ready)
                .map(|_| ())
        })?;
        delays.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "readiness change to Ready on /pods: p50 {:.3}s  p99 {:.3}s  ({} flips; probe period 1s)",
        pct(&mut delays, 50.0),
        pct(&mut delays, 99.0),
        delays.len()
    );
    remove_all(&k, "q", n, cri)
}

/// Removes the phase's manifests and waits until rkubelet and the runtime
/// have let go of every pod, so the next phase does not pay for this one.
fn remove_all(k: &Kubelet, prefix: &str, n: usize, cri: &RemoteRuntime) -> Result<()> {
    for i in 0..n {
        let _ = std::fs::remove_file(k.manifests.join(format!("{prefix}{i}.yaml")));
    }
    wait(Duration::from_secs(300), || {
        k.pods().is_empty().then_some(())
    })?;
    wait_runtime_clean(cri)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    if args.render > 0 {
        render_bench(args.render);
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cri =
        rt.block_on(async { RemoteRuntime::connect_lazy(ENDPOINT, Duration::from_secs(60)) })?;
    rt.block_on(cri.version())
        .context("containerd must be running (scripts/setup.sh)")?;
    let image_ref = rt
        .block_on(cri.image_status(IMAGE))?
        .context("busybox image missing (scripts/setup.sh)")?
        .id;
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "rkubelet-bench at commit {commit}; {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    {
        let k = Kubelet::start(&args.rkubelet)?;
        std::thread::sleep(Duration::from_secs(3));
        let (rss0, _) = proc_usage(k.child.id());
        println!("idle, no pods: RSS {:.1} MiB", rss0 as f64 / 1048576.0);
    }

    if args.probe_pods > 0 {
        probe_bench(&args, &cri)?;
    }
    if args.storm > 0 {
        storm_bench(&args, &cri)?;
    }
    for &n in &args.cluster {
        cluster_bench(&args, &rt, &cri, &image_ref, n)?;
    }
    for &n in &args.scrape {
        scrape_bench(&args, &cri, n)?;
    }
    for &n in &args.volumes {
        volumes_bench(&args, &cri, n)?;
    }
    if args.exec > 0 {
        exec_bench(&args, &rt, &cri)?;
    }

    for &n in &args.pods {
        println!("\n== {n} pod(s) ==");
        rt.block_on(remove_bare(&cri));
        let (mut bare, bare_wall) = rt.block_on(bare_cri(&cri, n, &image_ref))?;
        rt.block_on(remove_bare(&cri));
        let k = Kubelet::start(&args.rkubelet)?;
        let mut f = kubelet_start_pods(&k, n)?;
        let (bp50, bp99) = (pct(&mut bare, 50.0), pct(&mut bare, 99.0));
        let (kp50, kp99) = (pct(&mut f.per_pod, 50.0), pct(&mut f.per_pod, 99.0));
        println!("bare CRI : p50 {bp50:.3}s  p99 {bp99:.3}s  wall {bare_wall:.3}s");
        println!(
            "rkubelet : p50 {kp50:.3}s  p99 {kp99:.3}s  wall {:.3}s",
            f.wall
        );
        println!(
            "ratio    : wall {:.2}x  p50 {:.2}x",
            f.wall / bare_wall,
            kp50 / bp50
        );

        let pid = k.child.id();
        let (_, cpu0) = proc_usage(pid);
        std::thread::sleep(args.idle);
        let (rss, cpu1) = proc_usage(pid);
        println!(
            "idle {}s with {n} pod(s): RSS {:.1} MiB, CPU {:.2}s = {:.2}% of one core",
            args.idle.as_secs(),
            rss as f64 / 1048576.0,
            cpu1 - cpu0,
            100.0 * (cpu1 - cpu0) / args.idle.as_secs_f64()
        );

        // Each kill hits a different pod: a second kill of the same one
        // would meet the crash-loop backoff, which is not what is measured.
        let mut kills = Vec::new();
        for i in 0..args.kills.min(n) {
            let name = format!("p{i}-bench");
            let Some(id) = k
                .pods()
                .iter()
                .find(|p| p["metadata"]["name"] == name.as_str())
                .and_then(running_main)
            else {
                continue;
            };
            let cid = id.trim_start_matches("containerd://").to_string();
            let t0 = Instant::now();
            rt.block_on(cri.stop_container(&cid, 0))?;
            wait(Duration::from_secs(30), || {
                k.pods()
                    .iter()
                    .find(|p| p["metadata"]["name"] == name.as_str())
                    .and_then(|p| {
                        let c = p["status"]["containerStatuses"]
                            .as_array()?
                            .iter()
                            .find(|c| c["name"] == "main")?
                            .clone();
                        (c["containerID"].as_str() != Some(id.as_str())
                            || !c["state"]["running"].is_object())
                        .then_some(())
                    })
            })?;
            kills.push(t0.elapsed().as_secs_f64());
        }
        if !kills.is_empty() {
            println!(
                "killed container visible on /pods: p50 {:.3}s  p99 {:.3}s  ({} kills)",
                pct(&mut kills, 50.0),
                pct(&mut kills, 99.0),
                kills.len()
            );
        }
        remove_all(&k, "p", n, &cri)?;
    }
    Ok(())
}

/// Malformed manifest number `i`, rotating over what users drop by mistake
/// or malice: alias bombs, deep nesting, a few multi-megabyte strings,
/// repeated keys, binary garbage, absurd numbers, broken UTF-8.
fn hostile_manifest(i: usize) -> Vec<u8> {
    match i % 6 {
        0 => {
            let mut s = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
            for j in 1..10u8 {
                let (n, p) = ((b'a' + j) as char, (b'a' + j - 1) as char);
                s.push_str(&format!("{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"));
            }
            s.into_bytes()
        }
        1 => format!("{}{}", "{a: ".repeat(4000), "}".repeat(4000)).into_bytes(),
        2 if i % 200 == 2 => format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: \"{}\"\n",
            "z".repeat(4 << 20)
        )
        .into_bytes(),
        2 => "k: 1\n".repeat(500).into_bytes(),
        3 => (0..8192u32)
            .map(|k| (k.wrapping_mul(2246822519).wrapping_add(i as u32) >> 9) as u8)
            .collect(),
        4 => format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: n}}\nspec:\n  priority: 9{}\n",
            "9".repeat(1000)
        )
        .into_bytes(),
        _ => b"apiVersion: v1\nkind: Pod\nmetadata: {name: \xc3\x28}\n".to_vec(),
    }
}

/// RSS in MiB, sampled `n` times 200 ms apart; the median.
/// RssAnon and RssFile of `pid` in MiB (/proc/<pid>/status): the heap
/// apart from the mapped binary's code pages.
fn rss_split(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kib("RssAnon:"), kib("RssFile:"))
}

fn rss_median(pid: u32, n: usize) -> f64 {
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            proc_usage(pid).0 as f64 / 1048576.0
        })
        .collect();
    pct(&mut v, 50.0)
}

fn storm_bench(args: &Args, cri: &RemoteRuntime) -> Result<()> {
    let n = args.storm;
    println!("\n== storm: {n} malformed manifests written and removed, beside a canary ==");
    let k = Kubelet::start(&args.rkubelet)?;
    let pid = k.child.id();
    std::fs::write(k.manifests.join("canary.yaml"), manifest("canary"))?;
    let canary = wait(Duration::from_secs(60), || {
        k.pods().iter().find_map(running_main)
    })?;
    std::thread::sleep(Duration::from_secs(5));
    let idle = rss_median(pid, 10);
    let mut peak = idle;
    let mut sample = || {
        let r = proc_usage(pid).0 as f64 / 1048576.0;
        if r > peak {
            peak = r;
        }
    };
    let t0 = Instant::now();
    for i in 0..n {
        let tmp = k.dir.join(format!(".s{i}.tmp"));
        std::fs::write(&tmp, hostile_manifest(i))?;
        std::fs::rename(&tmp, k.manifests.join(format!("storm-{i}.yaml")))?;
        if i % 50 == 0 {
            sample();
        }
    }
    // Let the source read them all (a full rescan at the latest, 20 s).
    let log = k.dir.join("rkubelet.log");
    let last = format!("storm-{}.yaml", n - 1);
    let until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < until {
        sample();
        let seen = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&last);
        if seen && t0.elapsed() > Duration::from_secs(25) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..n {
        std::fs::remove_file(k.manifests.join(format!("storm-{i}.yaml")))?;
    }
    let end = Instant::now() + args.settle;
    while Instant::now() < end {
        sample();
        std::thread::sleep(Duration::from_millis(500));
    }
    let settled = rss_median(pid, 10);
    let still = k.pods().iter().find_map(running_main);
    println!(
        "RSS idle {idle:.1} MiB, peak {peak:.1} MiB ({:.2}x idle), settled {:.0} s after {settled:.1} MiB ({:+.1} % of idle)",
        peak / idle,
        args.settle.as_secs_f64(),
        (settled / idle - 1.0) * 100.0
    );
    println!(
        "canary kept its container: {}",
        if still.as_deref() == Some(canary.as_str()) {
            "yes"
        } else {
            "NO"
        }
    );
    std::fs::remove_file(k.manifests.join("canary.yaml"))?;
    remove_all(&k, "canary", 0, cri)?;
    Ok(())
}

/// The cost of the stats endpoints with `n` pods: per endpoint, `scrapes`
/// requests spaced past the provider's 1 s cache (so each one collects),
/// their latency and body size, and the CPU rkubelet and containerd spent
/// over them minus what they spend idle over as long.
fn scrape_bench(args: &Args, cri: &RemoteRuntime, n: usize) -> Result<()> {
    println!("\n== stats scrapes with {n} pod(s) ==");
    let k = Kubelet::start(&args.rkubelet)?;
    kubelet_start_pods(&k, n)?;
    let pid = k.child.id();
    let gap = Duration::from_millis(1100);
    let window = gap * args.scrapes as u32;
    // Idle baseline over the same window, so the figures are the scrapes'.
    let (_, c0) = proc_usage(pid);
    let r0 = runtime_cpu();
    std::thread::sleep(window);
    let idle_kubelet = proc_usage(pid).1 - c0;
    let idle_runtime = runtime_cpu() - r0;
    // Prometheus and metrics-server ask for gzip; the plain text is what
    // curl gets, and shows the collection and rendering alone.
    for (path, gzip) in [
        ("/metrics/cadvisor", false),
        ("/metrics/cadvisor", true),
        ("/metrics/resource", false),
        ("/metrics/resource", true),
        ("/stats/summary", false),
    ] {
        // One scrape first: the first collection also finds the runtime's
        // pid and the cgroup mounts.
        let _ = http_get_as(&k.ro, path, gzip);
        std::thread::sleep(gap);
        let (_, c0) = proc_usage(pid);
        let r0 = runtime_cpu();
        let start = Instant::now();
        let mut lat = Vec::new();
        let mut bytes = 0;
        for i in 0..args.scrapes {
            let next = start + gap * i as u32;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let t = Instant::now();
            let body = http_get_as(&k.ro, path, gzip).with_context(|| format!("GET {path}"))?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            bytes = body.len();
        }
        if let Some(d) = (start + window).checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let cpu = proc_usage(pid).1 - c0 - idle_kubelet;
        let rcpu = runtime_cpu() - r0 - idle_runtime;
        // The same endpoint at gaps that show no period (1.1 s and 1.7 s in
        // turn): collected when asked, as an irregular client's scrapes
        // are, where the steady ones above are collected ahead from the
        // fifth on (stats/cadence.rs).
        let mut cold = Vec::new();
        for i in 0..args.scrapes.min(12) {
            std::thread::sleep(if i % 2 == 0 { gap } else { gap + gap / 2 });
            let t = Instant::now();
            http_get_as(&k.ro, path, gzip).with_context(|| format!("GET {path}"))?;
            cold.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let name = format!("{path}{}", if gzip { " (gzip)" } else { "" });
        println!(
            "{name:<25}: p50 {:.1} ms  p99 {:.1} ms  {:.1} KiB  CPU per scrape: rkubelet {:.1} ms, containerd {:.1} ms; irregular gaps (collected when asked): p50 {:.1} ms",
            pct(&mut lat, 50.0),
            pct(&mut lat, 99.0),
            bytes as f64 / 1024.0,
            1000.0 * cpu.max(0.0) / args.scrapes as f64,
            1000.0 * rcpu.max(0.0) / args.scrapes as f64,
            pct(&mut cold, 50.0),
        );
    }
    // An HA pair of Prometheus servers (127.0.0.1 and 127.0.0.2), each on
    // a 4 s clock, 1.5 s apart: 1.5 s and 2.5 s intervals in turn on the
    // endpoint, but a period per client, whose scrapes are timed apart.
    for (path, gzip) in [("/metrics/cadvisor", true), ("/metrics/resource", true)] {
        let rounds = args.scrapes.clamp(6, 12);
        let start = Instant::now() + gap;
        let client = |ip: [u8; 4], offset: Duration| {
            let mut lat = Vec::new();
            for i in 0..rounds {
                let next = start + offset + Duration::from_secs(4) * i as u32;
                if let Some(d) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
                let t = Instant::now();
                let got = http_get_from(ip.into(), &k.ro, path, gzip);
                lat.push(got.map(|_| t.elapsed().as_secs_f64() * 1000.0));
            }
            lat.into_iter().collect::<Option<Vec<f64>>>()
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| client([127, 0, 0, 1], Duration::ZERO));
            let b = s.spawn(|| client([127, 0, 0, 2], Duration::from_millis(1500)));
            (a.join().ok().flatten(), b.join().ok().flatten())
        });
        let (Some(mut a), Some(mut b)) = (a, b) else {
            println!("HA pair on {path}: a scrape failed");
            continue;
        };
        let (mut a5, mut b5) = (a.split_off(4), b.split_off(4));
        println!(
            "HA pair on {path}{} (127.0.0.1 and .2, 4 s apart each, 1.5 s between): p50 from the fifth scrape {:.1} / {:.1} ms; the first four {:.1} / {:.1} ms",
            if gzip { " (gzip)" } else { "" },
            pct(&mut a5, 50.0),
            pct(&mut b5, 50.0),
            pct(&mut a, 50.0),
            pct(&mut b, 50.0),
        );
    }
    let ids = runtime_ids(cri);
    if let Some(f) = kernel_floor(pid, args.scrapes, gap, &ids.0, &ids.1) {
        println!(
            "kernel floor: the {} cgroup and net/dev files rkubelet holds open (/metrics/cadvisor's), read once per {:.1} s by this bench: median {:.1} ms CPU per pass ({:.2} us per file); the {} of them /stats/summary reads: {:.1} ms; the {} /metrics/resource reads: {:.1} ms",
            f.files,
            gap.as_secs_f64(),
            f.ms,
            1000.0 * f.ms / f.files.max(1) as f64,
            f.summary_files,
            f.summary_ms,
            f.resource_files,
            f.resource_ms,
        );
    }
    // Steady state as a cluster scrapes: one minute with metrics-server's
    // /metrics/resource every 15 s, then one with Prometheus'
    // /metrics/cadvisor beside it, both gzipped as those clients ask. Whole-minute CPU (background refreshes
    // included), total and above idle.
    let idle_per_sec = (
        idle_kubelet / window.as_secs_f64(),
        idle_runtime / window.as_secs_f64(),
    );
    for paths in [
        &["/metrics/resource"][..],
        &["/metrics/resource", "/metrics/cadvisor"][..],
    ] {
        let minute = Duration::from_secs(60);
        let every = Duration::from_secs(15);
        let (_, c0) = proc_usage(pid);
        let r0 = runtime_cpu();
        let start = Instant::now();
        let mut lat = Vec::new();
        for i in 0..4u32 {
            let next = start + every * i;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            for path in paths {
                let t = Instant::now();
                http_get_as(&k.ro, path, true).with_context(|| format!("GET {path}"))?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        if let Some(d) = (start + minute).checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = proc_usage(pid).1 - c0;
        let rcpu = runtime_cpu() - r0;
        println!(
            "{} every 15 s (gzip) for {secs:.0} s: p50 {:.1} ms  p99 {:.1} ms; rkubelet CPU {:.0} ms/min = {:.2}% of a core ({:.0} ms/min above idle); containerd {:.0} ms/min ({:.0} above idle)",
            paths.join(" + "),
            pct(&mut lat, 50.0),
            pct(&mut lat, 99.0),
            1000.0 * cpu * 60.0 / secs,
            100.0 * cpu / secs,
            1000.0 * (cpu / secs - idle_per_sec.0).max(0.0) * 60.0,
            1000.0 * rcpu * 60.0 / secs,
            1000.0 * (rcpu / secs - idle_per_sec.1).max(0.0) * 60.0,
        );
    }
    // Scrapes that meet a fresh snapshot: five at once share one collection.
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..5 {
            s.spawn(|| http_get(&k.ro, "/metrics/resource"));
        }
    });
    println!(
        "5 concurrent /metrics/resource scrapes (one collection): wall {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    // Prometheus' cAdvisor scrape arriving while metrics-server's is being
    // collected: it needs more than that collection, so it takes its own
    // after it, through the same open files.
    let mut lat = Vec::new();
    for _ in 0..args.scrapes.min(12) {
        std::thread::sleep(gap);
        std::thread::scope(|s| {
            let resource = s.spawn(|| http_get(&k.ro, "/metrics/resource"));
            std::thread::sleep(Duration::from_millis(2));
            let t = Instant::now();
            let got = http_get(&k.ro, "/metrics/cadvisor");
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            (resource.join().ok().flatten().is_some() && got.is_some())
                .then_some(())
                .context("GET /metrics/resource and /metrics/cadvisor at once")
        })?;
    }
    println!(
        "/metrics/cadvisor 2 ms after /metrics/resource: p50 {:.1} ms  max {:.1} ms",
        pct(&mut lat, 50.0),
        pct(&mut lat, 100.0),
    );
    remove_all(&k, "p", n, cri)
}

/// The kernel's share of a collection that no reader of those files can
/// avoid: the cgroup and `net/dev` files rkubelet keeps open (the ones its
/// collections read; reopened here through `/proc/<pid>/fd`, so the same
/// files), each read once at offset 0 per `gap` as a scrape reads them,
/// cold. The reading thread's CPU per pass, median of `passes`, for the
/// files `/metrics/resource` reads (CPU and memory usage, `memory.stat`,
/// swap), for those `/stats/summary` reads (the pods' and containers'
/// files every endpoint reads: not the sandboxes' nor the ones only
/// cAdvisor's text reads), and for all of them (`/metrics/cadvisor`'s, held
/// while it is scraped): a per-scrape CPU target below it cannot be met by
/// reading those files on this host. `sandboxes` and `containers` are the
/// runtime's ids, to tell their cgroups apart. `None` when rkubelet holds
/// none.
fn kernel_floor(
    pid: u32,
    passes: usize,
    gap: Duration,
    sandboxes: &[String],
    containers: &[String],
) -> Option<Floor> {
    use std::os::unix::fs::FileExt;
    const RESOURCE: [&str; 7] = [
        "cpuacct.usage",
        "cpu.stat",
        "memory.usage_in_bytes",
        "memory.current",
        "memory.stat",
        "memory.memsw.usage_in_bytes",
        "memory.swap.current",
    ];
    // Read for cAdvisor's text only (`FileReader::warm`); v1's cpu.stat
    // too (throttling), which on v2 is every endpoint's CPU usage.
    const CADVISOR_ONLY: [&str; 6] = [
        "cpuacct.stat",
        "memory.max_usage_in_bytes",
        "memory.failcnt",
        "memory.kmem.usage_in_bytes",
        "memory.events",
        "memory.peak",
    ];
    let thread_cpu = || rkubelet::stats::provider::thread_cpu_ns() as f64 / 1e6;
    let dir = format!("/proc/{pid}/fd");
    let targets: Vec<(String, std::fs::File)> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let t = std::fs::read_link(e.path()).ok()?;
            let t = t.to_string_lossy().into_owned();
            // `cgroup.procs` (warm) is read by the process walk, once per
            // 10 s, not per scrape.
            if (!t.starts_with("/sys/fs/cgroup/") && !t.contains("/net/dev"))
                || t.ends_with("/cgroup.procs")
            {
                return None;
            }
            Some((t, std::fs::File::open(e.path()).ok()?))
        })
        .collect();
    let v1 = targets.iter().any(|(t, _)| t.ends_with("/cpuacct.usage"));
    // (0: /metrics/resource's, 1: the summary's too, 2: cAdvisor's only)
    let mut files: Vec<(u8, std::fs::File)> = targets
        .into_iter()
        .map(|(t, f)| {
            let (parent, name) = t.rsplit_once('/').unwrap_or(("", &t));
            let parent = parent.rsplit('/').next().unwrap_or("");
            let is = |ids: &[String]| ids.iter().any(|id| parent.contains(id.as_str()));
            let cadvisor_only = is(sandboxes)
                || CADVISOR_ONLY.contains(&name)
                || (v1 && name == "cpu.stat")
                || (name == "pids.current" && is(containers));
            let class = if cadvisor_only {
                2
            } else if RESOURCE.contains(&name) {
                0
            } else {
                1
            };
            (class, f)
        })
        .collect();
    if files.is_empty() {
        return None;
    }
    files.sort_by_key(|(class, _)| *class);
    let count = |c: u8| files.iter().filter(|(class, _)| *class <= c).count();
    let (n_resource, n_summary) = (count(0), count(1));
    let mut buf = vec![0u8; 64 << 10];
    let (mut resource_ms, mut summary_ms, mut all_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes.max(1) {
        std::thread::sleep(gap);
        let t0 = thread_cpu();
        for (_, f) in &files[..n_resource] {
            let _ = f.read_at(&mut buf, 0);
        }
        let t1 = thread_cpu();
        for (_, f) in &files[n_resource..n_summary] {
            let _ = f.read_at(&mut buf, 0);
        }
        let t2 = thread_cpu();
        for (_, f) in &files[n_summary..] {
            let _ = f.read_at(&mut buf, 0);
        }
        resource_ms.push(t1 - t0);
        summary_ms.push(t2 - t0);
        all_ms.push(thread_cpu() - t0);
    }
    Some(Floor {
        resource_files: n_resource,
        resource_ms: pct(&mut resource_ms, 50.0),
        summary_files: n_summary,
        summary_ms: pct(&mut summary_ms, 50.0),
        files: files.len(),
        ms: pct(&mut all_ms, 50.0),
    })
}

/// What `kernel_floor` measured: median CPU per pass.
struct Floor {
    resource_files: usize,
    resource_ms: f64,
    summary_files: usize,
    summary_ms: f64,
    files: usize,
    ms: f64,
}

/// The runtime's sandbox and container ids.
fn runtime_ids(cri: &RemoteRuntime) -> (Vec<String>, Vec<String>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Default::default();
    };
    rt.block_on(async {
        let sandboxes = cri.list_pod_sandbox(None).await.unwrap_or_default();
        let containers = cri.list_containers(None).await.unwrap_or_default();
        (
            sandboxes.into_iter().map(|s| s.id).collect(),
            containers.into_iter().map(|c| c.id).collect(),
        )
    })
}

/// Exec latency through rkubelet beside a direct CRI exec, with one pod.
fn exec_bench(args: &Args, rt: &tokio::runtime::Runtime, cri: &RemoteRuntime) -> Result<()> {
    println!("\n== exec ==");
    let k = Kubelet::start(&args.rkubelet)?;
    std::fs::write(k.manifests.join("ex0.yaml"), manifest("ex0"))?;
    let id = wait(Duration::from_secs(60), || {
        k.pods()
            .iter()
            .find(|p| p["metadata"]["name"] == "ex0-bench")
            .and_then(running_main)
    })
    .context("pod ex0 running")?;
    let id = id.trim_start_matches("containerd://").to_string();
    let crt = k.dir.join("pki").join("kubelet.crt");
    let tls = exec::Tls {
        addr: &k.api,
        crt: &crt,
        name: "bench",
    };
    rt.block_on(exec::run(cri, &tls, "ex0-bench", &id, args.exec))?;
    remove_all(&k, "ex", 1, cri)
}

/// Waits until the runtime has no bench pods left, so the next phase does
/// not pay for this one's cleanup.
fn wait_runtime_clean(cri: &RemoteRuntime) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    wait(Duration::from_secs(300), || {
        let left = rt
            .block_on(cri.list_pod_sandbox(None))
            .ok()?
            .iter()
            .filter(|s| {
                s.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with("-bench"))
            })
            .count();
        (left == 0).then_some(())
    })
}

/// Cluster mode with `n` pods bound to the node at once.
fn cluster_bench(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    cri: &RemoteRuntime,
    image_ref: &str,
    n: usize,
) -> Result<()> {
    use apiserver::{ApiServer, ApiServerOptions, KubeconfigUser};
    println!("\n== cluster mode: {n} pod(s) bound at once (API server double) ==");
    rt.block_on(remove_bare(cri));
    let (mut bare, bare_wall) = rt.block_on(bare_cri(cri, n, image_ref))?;
    rt.block_on(remove_bare(cri));

    let api = ApiServer::start(ApiServerOptions::default());
    let node = "bench";
    let dir = std::env::temp_dir().join(format!("rkubelet-bench-kc-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (cert, key) = api.issue_client_cert(
        &format!("system:node:{node}"),
        &["system:nodes"],
        Duration::from_secs(24 * 3600),
    );
    let (c, k) = (dir.join("client.crt"), dir.join("client.key"));
    std::fs::write(&c, cert)?;
    std::fs::write(&k, key)?;
    let kc = dir.join("kubelet.conf");
    api.write_kubeconfig(&kc, KubeconfigUser::ClientCert { cert: c, key: k });
    let k = Kubelet::start_with(&args.rkubelet, &[format!("--kubeconfig={}", kc.display())])?;
    wait(Duration::from_secs(60), || api.get("nodes", None, node))
        .context("the node never registered")?;

    // Watch this node's pods as a client would, then bind n pods.
    let mut watch = api
        .client()
        .with_timeout(Duration::from_secs(600))
        .watch(&format!(
            "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3D{node}"
        ))?;
    let t0 = Instant::now();
    for i in 0..n {
        api.create(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": format!("c{i}"), "namespace": "default"},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 2,
                "containers": [{"name": "main", "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}]
            }
        }));
    }
    let mut done: HashMap<String, f64> = HashMap::new();
    while done.len() < n {
        let Some(ev) = watch.next_event()? else {
            bail!("the watch ended with {} of {n} pods running", done.len());
        };
        let p = &ev["object"];
        if p["status"]["phase"] == "Running" && running_main(p).is_some() {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            done.entry(name).or_insert(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > Duration::from_secs(300) {
            bail!("timed out with {} of {n} pods running", done.len());
        }
    }
    let mut per: Vec<f64> = done.values().copied().collect();
    let wall = per.iter().cloned().fold(0.0, f64::max);
    let (bp50, kp50) = (pct(&mut bare, 50.0), pct(&mut per, 50.0));
    println!(
        "bare CRI : p50 {bp50:.3}s  p99 {:.3}s  wall {bare_wall:.3}s",
        pct(&mut bare, 99.0)
    );
    println!(
        "rkubelet : p50 {kp50:.3}s  p99 {:.3}s  wall {wall:.3}s (bound -> Running through a watch)",
        pct(&mut per, 99.0)
    );
    println!(
        "ratio    : wall {:.2}x  p50 {:.2}x",
        wall / bare_wall,
        kp50 / bp50
    );

    // Steady state: API requests by kind, RSS and CPU over the idle window.
    std::thread::sleep(Duration::from_secs(5));
    let before = api.requests().len();
    let pid = k.child.id();
    let (_, cpu0) = proc_usage(pid);
    std::thread::sleep(args.idle);
    let (rss, cpu1) = proc_usage(pid);
    let reqs: Vec<_> = api.requests().into_iter().skip(before).collect();
    let kind = |r: &apiserver::RequestRecord| -> &'static str {
        let p = r.path.as_str();
        if p.starts_with("/api/v1/nodes/") && p.contains("/status") {
            "node status"
        } else if p.contains("/leases/") {
            "lease"
        } else if p.contains("/pods/") && p.contains("/status") {
            "pod status"
        } else if p.contains("/events") {
            "events"
        } else {
            "other"
        }
    };
    let mut by_kind: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &reqs {
        *by_kind.entry(kind(r)).or_default() += 1;
    }
    let per_min = |c: usize| c as f64 * 60.0 / args.idle.as_secs_f64();
    let breakdown: Vec<String> = by_kind
        .iter()
        .map(|(k, c)| format!("{k} {:.1}", per_min(*c)))
        .collect();
    println!(
        "steady state over {}s: {:.1} API requests/min ({})",
        args.idle.as_secs(),
        per_min(reqs.len()),
        breakdown.join(", ")
    );
    println!(
        "idle {}s with {n} API pod(s): RSS {:.1} MiB, CPU {:.2}s = {:.2}% of one core",
        args.idle.as_secs(),
        rss as f64 / 1048576.0,
        cpu1 - cpu0,
        100.0 * (cpu1 - cpu0) / args.idle.as_secs_f64()
    );

    // Graceful deletion of all of them, finished by the kubelet.
    let t1 = Instant::now();
    for i in 0..n {
        api.delete("pods", Some("default"), &format!("c{i}"), Some(2));
    }
    wait(Duration::from_secs(300), || {
        api.list("pods").is_empty().then_some(())
    })?;
    println!(
        "graceful deletion of {n} pod(s) (grace 2 s) until the objects are gone: {:.2}s",
        t1.elapsed().as_secs_f64()
    );
    drop(k);
    let _ = std::fs::remove_dir_all(&dir);
    wait_runtime_clean(cri)?;
    Ok(())
}

/// Pod data (issue 9's benchmark): bound-to-Running time of a pod with 10
/// configMap/secret volumes beside one with none, then `n` pods each with
/// a projected token volume and a shared configMap: rkubelet's RSS and the
/// object watches it holds (one per distinct object, not per pod).
fn volumes_bench(args: &Args, cri: &RemoteRuntime, n: usize) -> Result<()> {
    use apiserver::{ApiServer, ApiServerOptions};
    use serde_json::json;
    println!("\n== pod data: 10 configMap/secret volumes vs none; {n} pods with a token and a configMap ==");
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "bench";
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    api.publish_root_ca("default");
    for i in 0..5 {
        api.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm{i}"), "namespace": "default"},
            "data": {"a": "1", "b": "2"}}));
        api.create(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("s{i}"), "namespace": "default"},
            "data": {"a": "MQ==", "b": "Mg=="}}));
    }
    api.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "namespace": "default"}, "data": {"k": "v"}}));
    let dir = std::env::temp_dir().join(format!("rkubelet-bench-vol-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kc = api.node_kubeconfig(&dir, node);
    let k = Kubelet::start_with(&args.rkubelet, &[format!("--kubeconfig={}", kc.display())])?;
    wait(Duration::from_secs(60), || api.get("nodes", None, node))
        .context("the node never registered")?;
    let container = |mounts: Value| {
        json!([{"name": "main", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"], "volumeMounts": mounts}])
    };
    let running = |name: &str| -> Result<f64> {
        let t0 = Instant::now();
        wait(Duration::from_secs(120), || {
            api.get("pods", Some("default"), name)
                .filter(|p| p["status"]["phase"] == "Running" && running_main(p).is_some())
        })?;
        Ok(t0.elapsed().as_secs_f64())
    };
    let gone = |names: &[String]| -> Result<()> {
        for name in names {
            api.delete("pods", Some("default"), name, Some(0));
        }
        wait(Duration::from_secs(120), || {
            names
                .iter()
                .all(|n| api.get("pods", Some("default"), n).is_none())
                .then_some(())
        })
    };
    let (mut plain, mut vols) = (Vec::new(), Vec::new());
    for r in 0..5 {
        let name = format!("plain{r}");
        api.create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                "containers": container(json!([]))}}));
        plain.push(running(&name)?);
        let name10 = format!("vols{r}");
        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        for i in 0..5 {
            volumes.push(json!({"name": format!("c{i}"), "configMap": {"name": format!("cm{i}")}}));
            volumes
                .push(json!({"name": format!("s{i}"), "secret": {"secretName": format!("s{i}")}}));
            mounts.push(json!({"name": format!("c{i}"), "mountPath": format!("/c{i}")}));
            mounts.push(json!({"name": format!("s{i}"), "mountPath": format!("/s{i}")}));
        }
        api.create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name10, "namespace": "default"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                "volumes": volumes, "containers": container(json!(mounts))}}));
        vols.push(running(&name10)?);
        gone(&[name, name10])?;
    }
    let (p50, v50) = (pct(&mut plain, 50.0), pct(&mut vols, 50.0));
    println!(
        "bound -> Running: no volumes p50 {p50:.3}s; 10 configMap/secret volumes p50 {v50:.3}s; difference {:+.0} ms",
        (v50 - p50) * 1000.0
    );

    // n pods, each with the projected token volume the API server's
    // admission adds and a configMap every pod shares.
    let before = api.requests().len();
    let tokens_before = api.token_requests().len();
    let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    for name in &names {
        api.create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                // What admission sets; a token is bound to the pod's account.
                "serviceAccountName": "default",
                "volumes": [
                    {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
                    {"name": "shared", "configMap": {"name": "shared"}}],
                "containers": container(json!([
                    {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                    {"name": "shared", "mountPath": "/shared"}]))}}));
    }
    let t0 = Instant::now();
    wait(Duration::from_secs(600), || {
        let all = api.list("pods");
        (all.iter()
            .filter(|p| p["status"]["phase"] == "Running" && running_main(p).is_some())
            .count()
            >= n)
            .then_some(())
    })?;
    println!(
        "{n} pods with a token and a configMap Running after {:.2}s",
        t0.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(5));
    let (rss, _) = proc_usage(k.child.id());
    let reqs: Vec<_> = api.requests().into_iter().skip(before).collect();
    // One watch per (resource, object name): the path and its selector.
    let watches: std::collections::BTreeSet<(String, String)> = reqs
        .iter()
        .filter(|r| r.path.contains("watch=true"))
        .filter_map(|r| {
            let (path, query) = r.path.split_once('?')?;
            let sel = query
                .split('&')
                .find(|kv| kv.starts_with("fieldSelector=metadata.name"))?;
            Some((path.to_string(), sel.to_string()))
        })
        .collect();
    let tokens = api.token_requests().len() - tokens_before;
    let (anon, file) = rss_split(k.child.id());
    println!(
        "{n} pods: RSS {:.1} MiB (anonymous {anon:.1}, file-backed {file:.1}); object watches opened {} (distinct objects referenced: 2); TokenRequests {tokens}",
        rss as f64 / 1048576.0,
        watches.len()
    );
    gone(&names)?;
    drop(k);
    let _ = std::fs::remove_dir_all(&dir);
    wait_runtime_clean(cri)?;
    Ok(())
}

/// A cgroup sample with every figure cAdvisor's text shows, as a lab pod's
/// (one idle process, no disk I/O, PSI present).
fn render_sample(i: u64) -> rkubelet::stats::cgroup::CgroupSample {
    use rkubelet::stats::cgroup::*;
    use rkubelet::stats::processes::ProcessSample;
    let line = |total| PsiLine {
        total,
        ..Default::default()
    };
    let pair = PsiPair {
        some: line(123_456 + i),
        full: line(6_543 + i),
    };
    CgroupSample {
        cpu: Some(CpuSample {
            usage_ns: 123_456_789 * i + 7,
            user_ns: Some(50_000_000 * i),
            system_ns: Some(40_000_000 * i),
        }),
        memory: Some(MemorySample {
            usage: 1_234_567 + i,
            working_set: 1_034_567 + i,
            rss: 300_000 + i,
            cache: 700_000 + i,
            mapped_file: 4096,
            pgfault: 12_345 + i,
            pgmajfault: 3,
            max_usage: Some(2_345_678),
            failcnt: Some(0),
            swap: Some(0),
            kernel: Some(12_345),
            swap_limit: Some(0),
            reservation: Some(0),
            ..Default::default()
        }),
        pids: Some(1),
        processes: Some(1),
        cpu_shares: Some(2),
        cpu_period: Some(100_000),
        cpu_quota: Some(-1),
        throttling: None,
        psi: Some(Psi {
            cpu: Some(pair),
            memory: Some(pair),
            io: Some(pair),
        }),
        disk: Some(Default::default()),
        procs: Some(ProcessSample {
            processes: 1,
            fds: 3,
            threads: 1,
            first_pid: Some(100),
            max_open_files: Some(1_048_576),
            ..Default::default()
        }),
    }
}

/// `--render N`: cAdvisor's text rendered 200 times from one synthetic
/// snapshot; wall time per rendering, and the process's CPU and minor page
/// faults per rendering (nothing else runs in this process meanwhile).
fn render_bench(n: usize) {
    use rkubelet::stats::expo::{cadvisor_chunks, Machine};
    use rkubelet::stats::procfs::{FsFigures, FsStat, Interface};
    use rkubelet::stats::provider::{CgroupRaw, ContainerRaw, PodRaw, Snapshot};
    let id = |i: u64, salt: u64| format!("{:032x}{:032x}", i * 7919 + salt, (i + 1) * salt);
    let iface = |name: &str| Interface {
        name: name.into(),
        rx_bytes: 123_456,
        rx_packets: 1234,
        tx_bytes: 65_432,
        tx_packets: 543,
        ..Default::default()
    };
    let born = 1_700_000_000_000_000_000;
    let pods = (0..n as u64)
        .map(|i| {
            let uid = format!("{i:08x}-aaaa-bbbb-cccc-{:012x}", i * 17);
            let cg = format!("/kubepods/besteffort/pod{uid}");
            let (sb, c) = (id(i, 1), id(i, 2));
            PodRaw {
                name: format!("busybox-{i}-node"),
                namespace: "default".into(),
                uid,
                created_ns: born,
                sample: render_sample(i),
                sandbox_cgroup: Some(format!("{cg}/{sb}")),
                sandbox_sample: render_sample(i + 1),
                interfaces: vec![iface("eth0")],
                containers: vec![ContainerRaw {
                    cgroup: Some(format!("{cg}/{c}")),
                    id: c,
                    name: "main".into(),
                    image: "docker.io/library/busybox:latest".into(),
                    created_ns: born,
                    sample: render_sample(i + 2),
                    rootfs: Some((Some(4096), Some(3))),
                    ..Default::default()
                }],
                sandbox_id: sb,
                cgroup: Some(cg),
                ..Default::default()
            }
        })
        .collect();
    let mut snap = Snapshot {
        time_ns: 1_800_000_000_000_000_000,
        pods,
        sandbox_image: "registry.k8s.io/pause:3.10".into(),
        oom: Some(Default::default()),
        ..Default::default()
    };
    snap.node.filesystems = (0..334)
        .map(|i| FsStat {
            device: format!(
                "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/{}/shm",
                id(i, 5)
            ),
            capacity: 64 << 20,
            free: 64 << 20,
            inodes: Some((1000, 999)),
            disk: Default::default(),
        })
        .collect();
    snap.node.interfaces = vec![iface("eth0"), iface("cni0")];
    let fs = FsFigures {
        capacity: 1 << 40,
        inodes: 1 << 20,
        inodes_free: 1 << 19,
        ..Default::default()
    };
    snap.node.imagefs = Some((Some(fs), Some(1), Some(1)));
    snap.node.imagefs_device = Some("/dev/sda1".into());
    for name in [
        "/",
        "/kubepods",
        "/kubepods/besteffort",
        "/kubepods/burstable",
    ] {
        snap.hierarchy.push(CgroupRaw {
            name: name.into(),
            sample: render_sample(3),
            cpu_nano_cores: None,
        });
    }
    let facts = Default::default();
    let m = Machine {
        machine_id: "m",
        system_uuid: "s",
        boot_id: "b",
        cores: 2,
        memory: 16 << 30,
        facts: &facts,
    };
    // This process's CPU (ms) and minor faults so far.
    let usage = || {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
        // SAFETY: getrusage fills the struct it is given.
        let ru = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
            ru.assume_init()
        };
        let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
        (ms(ru.ru_utime) + ms(ru.ru_stime), ru.ru_minflt)
    };
    // Each rendering timed 200 times after 20 to warm up (the family
    // sizes remembered, the buffers kept).
    let time = |what: &str, f: &mut dyn FnMut() -> usize| {
        for _ in 0..20 {
            f();
        }
        const ROUNDS: usize = 200;
        let (cpu0, faults0) = usage();
        let mut walls = Vec::with_capacity(ROUNDS);
        let mut bytes = 0;
        for _ in 0..ROUNDS {
            let t = Instant::now();
            bytes = f();
            walls.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (cpu1, faults1) = usage();
        println!(
            "render {what}, {n} pods ({bytes} bytes): wall p50 {:.2} ms, p90 {:.2} ms; CPU {:.2} ms and {} minor faults per rendering",
            pct(&mut walls, 50.0),
            pct(&mut walls, 90.0),
            (cpu1 - cpu0) / ROUNDS as f64,
            (faults1 - faults0) / ROUNDS as i64,
        );
    };
    time("/metrics/cadvisor", &mut || {
        let chunks = cadvisor_chunks(Some(&snap), &m);
        chunks.iter().map(|c| c.len()).sum()
    });
    time("/metrics/resource", &mut || {
        rkubelet::stats::expo::resource(Some(&snap), "node").len()
    });
    time("/stats/summary", &mut || {
        let s = rkubelet::stats::summary::build(&snap, "node", false);
        serde_json::to_vec(&s).map_or(0, |b| b.len())
    });
}
