//! Prober tests: the manager and workers on paused time with the fake
//! runtime's scripted exec results, and the network handlers against small
//! servers on 127.0.0.1.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, Pod,
    PodSpec, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handlers::{self, HttpTarget, Outcome};
use super::worker::{initial_delay_left, Params, Run};
use super::*;
use crate::cri::fake::FakeRuntime;
use crate::cri::{self, ContainerState};
use crate::kuberuntime::{ContainerInfo, RuntimePod};

// ---------------------------------------------------------------- helpers

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn exec(cmd: &str) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![cmd.to_string()]),
        }),
        ..Default::default()
    }
}

fn with(mut p: Probe, f: impl FnOnce(&mut Probe)) -> Probe {
    f(&mut p);
    p
}

fn ctr(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some("busybox".into()),
        ..Default::default()
    }
}

fn pod(uid: &str, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn info(name: &str, id: &str, state: ContainerState, started_at: i64) -> ContainerInfo {
    ContainerInfo::from_cri(
        &cri::ContainerStatus {
            id: id.into(),
            metadata: Some(cri::v1::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: state as i32,
            created_at: started_at,
            started_at,
            ..Default::default()
        },
        "sb1",
    )
}

fn running(uid: &str, containers: &[(&str, &str)]) -> RuntimePod {
    running_since(uid, containers, now_ns())
}

fn running_since(uid: &str, containers: &[(&str, &str)], started_at: i64) -> RuntimePod {
    RuntimePod {
        uid: uid.into(),
        containers: containers
            .iter()
            .map(|(n, id)| info(n, id, ContainerState::ContainerRunning, started_at))
            .collect(),
        ..Default::default()
    }
}

struct Env {
    fake: Arc<FakeRuntime>,
    mgr: ProbeManager,
    rx: mpsc::Receiver<ProbeUpdate>,
    token: CancellationToken,
}

fn env() -> Env {
    let fake = Arc::new(FakeRuntime::new());
    let (tx, rx) = mpsc::channel(16);
    let token = CancellationToken::new();
    let mgr = ProbeManager::new(fake.clone(), tx, token.clone());
    Env {
        fake,
        mgr,
        rx,
        token,
    }
}

impl Env {
    async fn next(&mut self) -> ProbeUpdate {
        tokio::time::timeout(Duration::from_secs(3600), self.rx.recv())
            .await
            .expect("a probe update")
            .expect("channel open")
    }

    fn execs(&self, needle: &str) -> usize {
        self.fake
            .calls()
            .iter()
            .filter(|c| c.starts_with("ExecSync") && c.contains(needle))
            .count()
    }
}

fn update(container_id: &str, probe: ProbeType, success: bool) -> ProbeUpdate {
    ProbeUpdate {
        pod_uid: "u1".into(),
        container: "app".into(),
        container_id: container_id.into(),
        probe,
        success,
    }
}

// ------------------------------------------------------------ unit pieces

#[test]
fn defaults_apply_to_unset_and_zero_fields() {
    let p = Params::from_spec(&Probe::default());
    assert_eq!(p.initial_delay, Duration::ZERO);
    assert_eq!(p.period, Duration::from_secs(10));
    assert_eq!(p.timeout, Duration::from_secs(1));
    assert_eq!((p.success_threshold, p.failure_threshold), (1, 3));
    let zero = Probe {
        period_seconds: Some(0),
        timeout_seconds: Some(0),
        success_threshold: Some(0),
        failure_threshold: Some(0),
        initial_delay_seconds: Some(0),
        ..Default::default()
    };
    assert_eq!(Params::from_spec(&zero), p);
}

#[test]
fn thresholds_need_consecutive_results() {
    let p = Params::from_spec(&Probe {
        success_threshold: Some(2),
        failure_threshold: Some(3),
        ..Default::default()
    });
    let mut run = Run::default();
    assert_eq!(run.observe(false, &p), None);
    assert_eq!(run.observe(false, &p), None);
    assert_eq!(run.observe(true, &p), None, "a success breaks the run");
    assert_eq!(run.observe(false, &p), None);
    assert_eq!(run.observe(false, &p), None);
    assert_eq!(run.observe(false, &p), Some(false));
    assert_eq!(run.observe(true, &p), None);
    assert_eq!(run.observe(true, &p), Some(true));
}

#[test]
fn initial_delay_counts_from_container_start() {
    let d = Duration::from_secs(30);
    let left = initial_delay_left(now_ns() - 10_000_000_000, d);
    assert!(left <= Duration::from_secs(20) && left > Duration::from_secs(19));
    assert_eq!(
        initial_delay_left(now_ns() - 40_000_000_000, d),
        Duration::ZERO
    );
    assert_eq!(initial_delay_left(0, d), Duration::ZERO, "unknown start");
    assert_eq!(initial_delay_left(now_ns(), Duration::ZERO), Duration::ZERO);
}

#[test]
fn exec_command_expands_literal_env() {
    let env = vec![
        EnvVar {
            name: "PORT".into(),
            value: Some("8080".into()),
            ..Default::default()
        },
        EnvVar {
            name: "SECRET".into(),
            value_from: Some(Default::default()),
            ..Default::default()
        },
    ];
    let cmd: Vec<String> = [
        "check $(PORT)",
        "$(SECRET)",
        "$$(PORT)",
        "$(NOPE) $x",
        "$(open",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        handlers::expand_static(&cmd, &env),
        vec!["check 8080", "$(SECRET)", "$(PORT)", "$(NOPE) $x", "$(open"]
    );
}

#[tokio::test]
async fn exec_handler_maps_exit_codes_and_timeouts() {
    let fake = FakeRuntime::new();
    let cmd = || vec!["sh".to_string(), "-c".to_string(), "true".to_string()];
    let t = Duration::from_secs(1);
    assert_eq!(
        handlers::exec_probe(&fake, "c1", cmd(), t).await,
        Ok(Outcome::Success(String::new()))
    );
    fake.set_exec_result("c1", 2);
    assert_eq!(
        handlers::exec_probe(&fake, "c1", cmd(), t).await,
        Ok(Outcome::Failure(String::new()))
    );
    fake.set_exec_timeout("c1");
    assert_eq!(
        handlers::exec_probe(&fake, "c1", cmd(), t).await,
        Ok(Outcome::Failure("command \"sh -c true\" timed out".into()))
    );
    assert!(fake.calls().contains(&"ExecSync c1 sh -c true".to_string()));
}

// ------------------------------------------------------- manager, workers

#[tokio::test(start_paused = true)]
async fn liveness_fails_after_failure_threshold() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.liveness_probe = Some(exec("live"));
    e.mgr.sync_pod(
        &pod("u1", vec![c]),
        &running("u1", &[("app", "c1")]),
        "10.88.0.5",
    );
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert_eq!(e.execs("live"), 2);
    assert!(e.mgr.failed("u1").is_empty(), "2 failures < threshold 3");
    assert!(e.rx.try_recv().is_err());

    assert_eq!(e.next().await, update("c1", ProbeType::Liveness, false));
    assert_eq!(t0.elapsed(), Duration::from_secs(20));
    assert_eq!(e.mgr.failed("u1"), HashSet::from(["app".to_string()]));
    assert_eq!(
        e.mgr.failed_container_ids("u1"),
        HashSet::from(["c1".to_string()])
    );
    // On hold until a new instance: no more probing, no more updates.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(e.execs("live"), 3);
    assert!(e.rx.try_recv().is_err());
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn readiness_needs_success_threshold_and_sends_only_changes() {
    let mut e = env();
    let mut c = ctr("app");
    c.readiness_probe = Some(with(exec("ready"), |p| {
        p.period_seconds = Some(5);
        p.success_threshold = Some(2);
    }));
    let p = pod("u1", vec![c]);
    let rt = running("u1", &[("app", "c1")]);
    e.mgr.sync_pod(&p, &rt, "10.88.0.5");
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), false)])
    );

    let t0 = Instant::now();
    assert_eq!(e.next().await, update("c1", ProbeType::Readiness, true));
    assert_eq!(t0.elapsed(), Duration::from_secs(5), "second success");
    assert_eq!(e.mgr.readiness("u1"), HashMap::from([("app".into(), true)]));

    // Syncing again with the same instance changes nothing.
    e.mgr.sync_pod(&p, &rt, "10.88.0.5");
    tokio::time::sleep(Duration::from_secs(32)).await;
    assert!(e.rx.try_recv().is_err(), "no update while unchanged");
    assert_eq!(e.mgr.readiness("u1"), HashMap::from([("app".into(), true)]));

    e.fake.set_exec_result("c1", 1);
    let t1 = Instant::now();
    assert_eq!(e.next().await, update("c1", ProbeType::Readiness, false));
    // Probes at 40, 45 and 50 s.
    assert_eq!(t1.elapsed(), Duration::from_secs(13), "three failures");
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), false)])
    );
    assert!(e.mgr.failed("u1").is_empty(), "readiness never restarts");
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn no_probe_before_initial_delay() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.liveness_probe = Some(with(exec("live"), |p| {
        p.initial_delay_seconds = Some(15);
        p.failure_threshold = Some(1);
    }));
    let t0 = Instant::now();
    e.mgr.sync_pod(
        &pod("u1", vec![c]),
        &running("u1", &[("app", "c1")]),
        "10.88.0.5",
    );
    tokio::time::sleep(Duration::from_millis(14_900)).await;
    assert_eq!(e.execs("live"), 0);
    assert_eq!(e.next().await, update("c1", ProbeType::Liveness, false));
    let waited = t0.elapsed();
    assert!(waited > Duration::from_millis(14_900) && waited <= Duration::from_secs(15));
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn initial_delay_already_partly_elapsed() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.liveness_probe = Some(with(exec("live"), |p| {
        p.initial_delay_seconds = Some(15);
        p.failure_threshold = Some(1);
    }));
    let started = now_ns() - 10_000_000_000;
    let t0 = Instant::now();
    e.mgr.sync_pod(
        &pod("u1", vec![c]),
        &running_since("u1", &[("app", "c1")], started),
        "10.88.0.5",
    );
    e.next().await;
    let waited = t0.elapsed();
    assert!(waited > Duration::from_millis(4_900) && waited <= Duration::from_secs(5));
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn startup_probe_gates_liveness_and_readiness() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.startup_probe = Some(with(exec("startup"), |p| {
        p.period_seconds = Some(1);
        p.failure_threshold = Some(30);
    }));
    c.liveness_probe = Some(with(exec("live"), |p| {
        p.period_seconds = Some(1);
        p.failure_threshold = Some(1);
    }));
    c.readiness_probe = Some(with(exec("ready"), |p| p.period_seconds = Some(10)));
    e.mgr.sync_pod(
        &pod("u1", vec![c]),
        &running("u1", &[("app", "c1")]),
        "10.88.0.5",
    );
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert_eq!(e.execs("startup"), 6);
    assert_eq!(e.execs("live"), 0, "liveness waits for startup");
    assert_eq!(e.execs("ready"), 0, "readiness waits for startup");
    assert!(!e.mgr.started("u1", "app"));
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), false)])
    );
    assert!(
        e.mgr.failed("u1").is_empty(),
        "startup still within its threshold"
    );
    assert!(e.rx.try_recv().is_err());

    e.fake.set_exec_result("c1", 0);
    assert_eq!(e.next().await, update("c1", ProbeType::Startup, true));
    assert!(e.mgr.started("u1", "app"));
    let mut rest = [e.next().await, e.next().await];
    rest.sort_by_key(|u| u.probe.as_str());
    assert_eq!(
        rest,
        [
            update("c1", ProbeType::Liveness, true),
            update("c1", ProbeType::Readiness, true),
        ]
    );
    assert_eq!(e.mgr.readiness("u1"), HashMap::from([("app".into(), true)]));
    // Once started, the startup probe is not run again.
    let startups = e.execs("startup");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(e.execs("startup"), startups);
    assert!(e.execs("live") >= 20);
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn startup_failure_marks_container_failed() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.startup_probe = Some(with(exec("startup"), |p| p.period_seconds = Some(1)));
    c.readiness_probe = Some(exec("ready"));
    e.mgr.sync_pod(
        &pod("u1", vec![c]),
        &running("u1", &[("app", "c1")]),
        "10.88.0.5",
    );
    assert_eq!(e.next().await, update("c1", ProbeType::Startup, false));
    assert_eq!(e.mgr.failed("u1"), HashSet::from(["app".to_string()]));
    assert!(!e.mgr.started("u1", "app"));
    assert_eq!(e.execs("ready"), 0);
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn restarted_container_gets_fresh_workers_and_results() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.liveness_probe = Some(with(exec("live"), |p| p.failure_threshold = Some(1)));
    c.readiness_probe = Some(with(exec("ready"), |p| p.period_seconds = Some(1)));
    let p = pod("u1", vec![c]);
    e.mgr
        .sync_pod(&p, &running("u1", &[("app", "c1")]), "10.88.0.5");
    assert_eq!(e.next().await, update("c1", ProbeType::Liveness, false));
    assert_eq!(e.mgr.failed("u1"), HashSet::from(["app".to_string()]));

    // The runtime manager restarted it: a new instance, c2, is running.
    e.fake.set_exec_result("c2", 0);
    let old = e.execs("c1 ");
    e.mgr
        .sync_pod(&p, &running("u1", &[("app", "c2")]), "10.88.0.5");
    assert!(e.mgr.failed("u1").is_empty(), "results belong to c1");
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), false)])
    );
    let mut got = [e.next().await, e.next().await];
    got.sort_by_key(|u| u.probe.as_str());
    assert_eq!(
        got,
        [
            update("c2", ProbeType::Liveness, true),
            update("c2", ProbeType::Readiness, true),
        ]
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(e.execs("c1 "), old, "c1's workers stopped");
    assert_eq!(e.mgr.readiness("u1"), HashMap::from([("app".into(), true)]));
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn stopped_container_and_removed_pod_stop_probing() {
    let mut e = env();
    let mut c = ctr("app");
    c.readiness_probe = Some(with(exec("ready"), |p| p.period_seconds = Some(1)));
    let p = pod("u1", vec![c]);
    e.mgr
        .sync_pod(&p, &running("u1", &[("app", "c1")]), "10.88.0.5");
    assert_eq!(e.next().await, update("c1", ProbeType::Readiness, true));

    let exited = RuntimePod {
        uid: "u1".into(),
        containers: vec![info("app", "c1", ContainerState::ContainerExited, now_ns())],
        ..Default::default()
    };
    e.mgr.sync_pod(&p, &exited, "10.88.0.5");
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), false)])
    );
    let n = e.execs("ready");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(e.execs("ready"), n);

    e.mgr
        .sync_pod(&p, &running("u1", &[("app", "c2")]), "10.88.0.5");
    assert_eq!(e.next().await, update("c2", ProbeType::Readiness, true));
    assert!(!series(&e.mgr.metrics_text()).is_empty());
    e.mgr.remove_pod("u1");
    assert!(e.mgr.readiness("u1").is_empty());
    assert!(e.mgr.started("u1", "app"));
    assert_eq!(series(&e.mgr.metrics_text()), Vec::<String>::new());
    let n = e.execs("ready");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(e.execs("ready"), n);
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn sidecars_are_probed_but_not_plain_init_containers() {
    let mut e = env();
    let mut sidecar = ctr("proxy");
    sidecar.restart_policy = Some("Always".into());
    sidecar.readiness_probe = Some(exec("sidecar"));
    let mut init = ctr("setup");
    init.readiness_probe = Some(exec("setup"));
    let mut app = ctr("app");
    app.readiness_probe = Some(exec("app"));
    let plain = ctr("plain");
    let mut p = pod("u1", vec![app, plain]);
    p.spec.as_mut().unwrap().init_containers = Some(vec![init, sidecar]);
    let rt = running(
        "u1",
        &[
            ("app", "c1"),
            ("plain", "c2"),
            ("setup", "c3"),
            ("proxy", "c4"),
        ],
    );
    e.mgr.sync_pod(&p, &rt, "10.88.0.5");
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), false), ("proxy".into(), false)])
    );
    e.next().await;
    e.next().await;
    assert_eq!(
        e.mgr.readiness("u1"),
        HashMap::from([("app".into(), true), ("proxy".into(), true)])
    );
    assert_eq!(e.execs("setup"), 0);
    assert!(e.mgr.started("u1", "plain"));
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn deletion_stops_liveness_quietly() {
    let mut e = env();
    e.fake.set_exec_result("c1", 1);
    let mut c = ctr("app");
    c.liveness_probe = Some(with(exec("live"), |p| {
        p.period_seconds = Some(1);
        p.failure_threshold = Some(1);
    }));
    let mut p = pod("u1", vec![c]);
    e.mgr
        .sync_pod(&p, &running("u1", &[("app", "c1")]), "10.88.0.5");
    assert_eq!(e.next().await, update("c1", ProbeType::Liveness, false));
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
    ));
    e.mgr
        .sync_pod(&p, &running("u1", &[("app", "c1")]), "10.88.0.5");
    assert!(e.mgr.failed("u1").is_empty());
    e.token.cancel();
}

#[tokio::test(start_paused = true)]
async fn metrics_text_matches_upstream_format() {
    let mut e = env();
    let mut c = ctr("app");
    c.readiness_probe = Some(with(exec("ready"), |p| {
        p.period_seconds = Some(5);
        p.success_threshold = Some(2);
    }));
    c.liveness_probe = Some(with(exec("live"), |p| p.period_seconds = Some(100)));
    e.mgr.sync_pod(
        &pod("u1", vec![c]),
        &running("u1", &[("app", "c1")]),
        "10.88.0.5",
    );
    let mut got = [e.next().await, e.next().await];
    got.sort_by_key(|u| u.probe.as_str());
    assert_eq!(got[1], update("c1", ProbeType::Readiness, true));
    let text = crate::metrics::to_prometheus_text(&e.mgr.metrics_text());
    // Upstream's families: prober_probe_total{probe_type,result,container,
    // pod,namespace,pod_uid} and prober_probe_duration_seconds{probe_type,
    // container,pod,namespace} (prober_manager.go), written as
    // client_golang writes them: families and label pairs sorted by name.
    assert!(text.contains("# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n# TYPE prober_probe_total counter\n"), "{text}");
    assert!(
        text.contains("# TYPE prober_probe_duration_seconds histogram\n"),
        "{text}"
    );
    let totals: Vec<String> = series(&text)
        .into_iter()
        .filter(|l| l.starts_with("prober_probe_total"))
        .collect();
    assert_eq!(
        totals,
        [
            "prober_probe_total{container=\"app\",namespace=\"default\",pod=\"web\",pod_uid=\"u1\",probe_type=\"Liveness\",result=\"successful\"} 1",
            "prober_probe_total{container=\"app\",namespace=\"default\",pod=\"web\",pod_uid=\"u1\",probe_type=\"Readiness\",result=\"successful\"} 2",
        ]
    );
    let at = |family: &str| text.find(&format!("# HELP {family} ")).unwrap();
    assert!(at("prober_probe_duration_seconds") < at("prober_probe_total"));
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let hist: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "prober_probe_duration_seconds")
        .collect();
    assert_eq!(hist.len(), 2, "{text}");
    for h in &hist {
        let mut keys: Vec<&String> = h.labels.keys().collect();
        keys.sort();
        assert_eq!(keys, ["container", "namespace", "pod", "probe_type"]);
        let prometheus_parse::Value::Histogram(b) = &h.value else {
            panic!("not a histogram: {h:?}");
        };
        // DefBuckets plus +Inf.
        assert_eq!(b.len(), 12);
    }
    e.fake.set_exec_result("c1", 3);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(series(&e.mgr.metrics_text()).iter().any(|l| l.starts_with(
        "prober_probe_total{container=\"app\",namespace=\"default\",pod=\"web\",pod_uid=\"u1\",probe_type=\"Readiness\",result=\"failed\"}"
    ) && l.ends_with("} 1")));
    e.token.cancel();
}

// ------------------------------------------------------------- network

/// A tiny HTTP/1 server on 127.0.0.1 that records each request head.
async fn http_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                log.lock().push(head);
                let (status, extra, body) = match path.as_str() {
                    "/ok" | "/echo" => ("200 OK", String::new(), "ok".to_string()),
                    "/fail" => ("500 Internal Server Error", String::new(), "boom".into()),
                    "/redirect" => ("302 Found", "Location: /ok\r\n".into(), String::new()),
                    "/away" => (
                        "302 Found",
                        "Location: http://localhost:1/ok\r\n".into(),
                        "moved".into(),
                    ),
                    "/loop" => ("302 Found", "Location: /loop\r\n".into(), String::new()),
                    "/big" => ("200 OK", String::new(), "a".repeat(64 * 1024)),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        return;
                    }
                    _ => ("404 Not Found", String::new(), String::new()),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, seen)
}

fn http_target(port: IntOrString, path: &str, headers: &[(&str, &str)]) -> HttpTarget {
    let mut c = ctr("app");
    c.ports = Some(vec![ContainerPort {
        name: Some("http".into()),
        container_port: 1,
        ..Default::default()
    }]);
    let action = HTTPGetAction {
        path: Some(path.into()),
        port,
        http_headers: Some(
            headers
                .iter()
                .map(|(n, v)| HTTPHeader {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
        ),
        ..Default::default()
    };
    HttpTarget::from_action(&action, &c, "127.0.0.1").unwrap()
}

async fn get(port: u16, path: &str) -> Outcome {
    let t = http_target(IntOrString::Int(port as i32), path, &[]);
    handlers::http_probe(&t, Duration::from_secs(2))
        .await
        .unwrap()
}

#[tokio::test]
async fn http_probe_statuses_and_redirects() {
    let (port, seen) = http_server().await;
    assert_eq!(get(port, "/ok").await, Outcome::Success("ok".into()));
    assert_eq!(
        get(port, "/fail").await,
        Outcome::Failure("HTTP probe failed with statuscode: 500".into())
    );

    // Same host: followed.
    seen.lock().clear();
    assert_eq!(get(port, "/redirect").await, Outcome::Success("ok".into()));
    let paths: Vec<String> = seen
        .lock()
        .iter()
        .map(|h| h.split(' ').nth(1).unwrap().to_string())
        .collect();
    assert_eq!(paths, ["/redirect", "/ok"]);

    // Another host: not followed, and a success with a warning.
    seen.lock().clear();
    assert_eq!(
        get(port, "/away").await,
        Outcome::Warning("Probe terminated redirects, Response body: moved".into())
    );
    assert_eq!(seen.lock().len(), 1);

    // Go's client gives up after 10 redirects: a failure.
    seen.lock().clear();
    match get(port, "/loop").await {
        Outcome::Failure(msg) => assert!(msg.ends_with("stopped after 10 redirects"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().len(), 10);

    // The body is read up to 10 KiB.
    match get(port, "/big").await {
        Outcome::Success(body) => assert_eq!(body.len(), 10 * 1024),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn http_probe_headers_named_port_and_errors() {
    let (port, seen) = http_server().await;
    let t = http_target(
        IntOrString::Int(port as i32),
        "/echo",
        &[("X-Probe", "yes"), ("x-probe", "again")],
    );
    assert_eq!(t.url.to_string(), format!("http://127.0.0.1:{port}/echo"));
    assert_eq!(
        handlers::http_probe(&t, Duration::from_secs(2)).await,
        Ok(Outcome::Success("ok".into()))
    );
    let head = seen.lock().pop().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /echo http/1.1\r\n"), "{head}");
    for line in [
        format!("host: 127.0.0.1:{port}"),
        "user-agent: kube-probe/1.34".into(),
        "accept: */*".into(),
        "x-probe: yes".into(),
        "x-probe: again".into(),
    ] {
        assert!(head.contains(&format!("{line}\r\n")), "{line} in {head}");
    }

    // Spec headers override the defaults; Host goes into the Host header.
    let t = http_target(
        IntOrString::Int(port as i32),
        "echo?x=1",
        &[
            ("user-agent", "mine"),
            ("Accept", ""),
            ("Host", "example.test"),
        ],
    );
    handlers::http_probe(&t, Duration::from_secs(2))
        .await
        .unwrap();
    let head = seen.lock().pop().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /echo?x=1 http/1.1\r\n"), "{head}");
    assert!(head.contains("host: example.test\r\n"), "{head}");
    assert!(head.contains("user-agent: mine\r\n"), "{head}");
    assert!(!head.contains("kube-probe"), "{head}");
    assert!(!head.contains("accept:"), "{head}");

    // Named ports come from the container's ports.
    let t = http_target(IntOrString::String("http".into()), "/", &[]);
    assert_eq!(t.url.port, 1);
    let missing = HTTPGetAction {
        port: IntOrString::String("nope".into()),
        ..Default::default()
    };
    assert!(HttpTarget::from_action(&missing, &ctr("app"), "127.0.0.1").is_err());

    // Nothing listening: a failure.
    let closed = closed_port().await;
    assert!(matches!(get(closed, "/").await, Outcome::Failure(_)));

    // No answer within the timeout: a failure.
    let t = http_target(IntOrString::Int(port as i32), "/slow", &[]);
    match handlers::http_probe(&t, Duration::from_millis(300)).await {
        Ok(Outcome::Failure(msg)) => assert!(msg.contains("deadline exceeded"), "{msg}"),
        other => panic!("{other:?}"),
    }

    // Plain HTTP against a TLS-only port would not get an HTTP answer.
    let mut https = http_target(IntOrString::Int(port as i32), "/", &[]);
    https.url.scheme = "https".into();
    assert!(matches!(
        handlers::http_probe(&https, Duration::from_secs(1)).await,
        Ok(Outcome::Failure(_))
    ));
}

/// A one-shot HTTPS server with a self-signed certificate, answering `status`.
async fn tls_server(status: &'static str) -> u16 {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut tls = acceptor.accept(s).await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = tokio::io::AsyncReadExt::read(&mut tls, &mut buf).await;
        let resp = format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        let _ = tokio::io::AsyncWriteExt::write_all(&mut tls, resp.as_bytes()).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut tls).await;
    });
    port
}

#[tokio::test]
async fn https_probe_skips_certificate_verification_like_upstream() {
    for (status, ok) in [("200 OK", true), ("503 Service Unavailable", false)] {
        let port = tls_server(status).await;
        let mut t = http_target(IntOrString::Int(port as i32), "/livez", &[]);
        t.url.scheme = "https".into();
        let out = handlers::http_probe(&t, Duration::from_secs(5)).await;
        match (out, ok) {
            (Ok(Outcome::Success(_)), true) | (Ok(Outcome::Failure(_)), false) => {}
            (other, _) => panic!("{status}: {other:?}"),
        }
    }
}

async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    port
}

#[tokio::test]
async fn tcp_probe_open_and_closed_ports() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = l.local_addr().unwrap().port();
    assert_eq!(
        handlers::tcp_probe("127.0.0.1", open, Duration::from_secs(1)).await,
        Outcome::Success(String::new())
    );
    let closed = closed_port().await;
    match handlers::tcp_probe("127.0.0.1", closed, Duration::from_secs(1)).await {
        Outcome::Failure(msg) => assert!(msg.starts_with(&format!("dial tcp 127.0.0.1:{closed}"))),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn tcp_and_http_probes_through_the_manager() {
    let (port, _seen) = http_server().await;
    let (tx, mut rx) = mpsc::channel(16);
    let token = CancellationToken::new();
    let mgr = ProbeManager::new(Arc::new(FakeRuntime::new()), tx, token.clone());
    let mut c = ctr("app");
    c.ports = Some(vec![ContainerPort {
        name: Some("web".into()),
        container_port: port as i32,
        ..Default::default()
    }]);
    c.readiness_probe = Some(Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/ok".into()),
            port: IntOrString::String("web".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    c.liveness_probe = Some(Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(port as i32),
            ..Default::default()
        }),
        ..Default::default()
    });
    mgr.sync_pod(
        &pod("u1", vec![c]),
        &running("u1", &[("app", "c1")]),
        "127.0.0.1",
    );
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    got.sort_by_key(|u| u.probe.as_str());
    assert_eq!(
        got,
        [
            update("c1", ProbeType::Liveness, true),
            update("c1", ProbeType::Readiness, true),
        ]
    );
    assert_eq!(mgr.readiness("u1"), HashMap::from([("app".into(), true)]));
    token.cancel();
}

// ------------------------------------------------------------------ gRPC

/// A gRPC body: one message, then `grpc-status: 0` trailers.
struct GrpcBody(Option<Vec<u8>>, bool);

impl hyper::body::Body for GrpcBody {
    type Data = std::io::Cursor<Vec<u8>>;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use hyper::body::Frame;
        if let Some(data) = self.0.take() {
            return std::task::Poll::Ready(Some(Ok(Frame::data(std::io::Cursor::new(data)))));
        }
        if !self.1 {
            self.1 = true;
            let mut t = hyper::HeaderMap::new();
            t.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
            return std::task::Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        std::task::Poll::Ready(None)
    }
}

/// A gRPC health server on 127.0.0.1: service "down" is NOT_SERVING,
/// everything else SERVING.
async fn grpc_health_server() -> u16 {
    use hyper::body::Body as _;
    use prost::Message;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        assert_eq!(req.uri().path(), "/grpc.health.v1.Health/Check");
                        let mut body = req.into_body();
                        let mut buf = Vec::new();
                        while let Some(frame) =
                            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx))
                                .await
                        {
                            if let Ok(data) = frame.unwrap().into_data() {
                                buf.extend_from_slice(&data);
                            }
                        }
                        let req = health::HealthCheckRequest::decode(&buf[5..]).unwrap();
                        use health::health_check_response::ServingStatus;
                        let status = if req.service == "down" {
                            ServingStatus::NotServing
                        } else {
                            ServingStatus::Serving
                        };
                        let msg = health::HealthCheckResponse {
                            status: status as i32,
                        }
                        .encode_to_vec();
                        let mut out = vec![0u8];
                        out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                        out.extend_from_slice(&msg);
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(GrpcBody(Some(out), false))
                                .unwrap(),
                        )
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn grpc_probe_checks_health_service() {
    let port = grpc_health_server().await;
    let t = Duration::from_secs(2);
    assert_eq!(
        handlers::grpc_probe("127.0.0.1", port, "", t).await,
        Outcome::Success("service healthy".into())
    );
    assert_eq!(
        handlers::grpc_probe("127.0.0.1", port, "down", t).await,
        Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
    );
    let closed = closed_port().await;
    match handlers::grpc_probe("127.0.0.1", closed, "", t).await {
        Outcome::Failure(msg) => assert!(msg.starts_with("error: failed to connect"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // Through the probe spec too.
    let spec = Probe {
        grpc: Some(GRPCAction {
            port: port as i32,
            service: None,
        }),
        ..Default::default()
    };
    let fake = FakeRuntime::new();
    assert_eq!(
        handlers::run_probe(&fake, &spec, &ctr("app"), "c1", "127.0.0.1", t).await,
        Ok(Outcome::Success("service healthy".into()))
    );
}

/// The sample lines of an exposition.
fn series(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}
