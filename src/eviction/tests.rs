use super::*;
use serde_json::json;
use std::collections::BTreeMap;

const MI: u64 = 1 << 20;

fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ts(s: i64) -> String {
    format!("2026-11-28T00:00:{:02}Z", s % 60)
}

/// A pod with one container `c` asking for `memory` (none: BestEffort).
fn pod(name: &str, memory: Option<&str>, priority: i32) -> Arc<Pod> {
    let resources = match memory {
        Some(m) => json!({"requests": {"memory": m}}),
        None => json!({}),
    };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"priority": priority, "containers": [{"name": "c", "image": "busybox", "resources": resources}]}
        }))
        .unwrap(),
    )
}

fn pod_stats(name: &str, working_set: u64, t: i64) -> serde_json::Value {
    json!({
        "podRef": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "startTime": ts(0),
        "containers": [{"name": "c", "startTime": ts(0), "memory": {"time": ts(t), "workingSetBytes": working_set}}],
        "memory": {"time": ts(t), "workingSetBytes": working_set}
    })
}

fn summary(available: u64, t: i64, pods: Vec<serde_json::Value>) -> Summary {
    serde_json::from_value(json!({
        "node": {
            "nodeName": "n1",
            "startTime": ts(0),
            "memory": {"time": ts(t), "availableBytes": available, "workingSetBytes": 1000 * MI},
            "rlimit": {"time": ts(t), "maxpid": 1000, "curproc": 100}
        },
        "pods": pods
    }))
    .unwrap()
}

#[test]
fn thresholds_parse_as_upstreams_parse_threshold_config() {
    let t = parse_config(
        true,
        &map(&[("memory.available", "100Mi"), ("nodefs.available", "10%")]),
        &map(&[("memory.available", "300Mi")]),
        &map(&[("memory.available", "1m30s")]),
        &map(&[("nodefs.available", "5%")]),
    )
    .unwrap();
    // Hard ones, then soft, then allocatable for enforceNodeAllocatable=pods.
    let signals: Vec<(&str, bool)> = t.iter().map(|t| (t.signal.as_str(), t.is_hard())).collect();
    assert_eq!(
        signals,
        [
            ("memory.available", true),
            ("nodefs.available", true),
            ("memory.available", false),
            ("allocatableMemory.available", true),
        ]
    );
    assert_eq!(t[2].grace, Duration::from_secs(90));
    assert_eq!(t[1].min_reclaim, Some(Value::Percentage(0.05)));
    assert_eq!(t[0].value.amount(0), 100 * 1024 * 1024);

    // "0%" and "100%" switch a signal off.
    let off = parse_config(
        false,
        &map(&[("memory.available", "0%"), ("nodefs.available", "100%")]),
        &map(&[]),
        &map(&[]),
        &map(&[]),
    )
    .unwrap();
    assert!(off.is_empty());

    let err = |hard: &[(&str, &str)], soft: &[(&str, &str)]| {
        parse_config(false, &map(hard), &map(soft), &map(&[]), &map(&[]))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&[("memory.free", "1Gi")], &[]),
        "unsupported eviction signal memory.free"
    );
    assert_eq!(
        err(&[("nodefs.available", "120%")], &[]),
        "eviction percentage threshold nodefs.available must be <= 100%: 120%"
    );
    assert_eq!(
        err(&[("memory.available", "-1Gi")], &[]),
        "eviction threshold memory.available must be positive: -1Gi"
    );
    assert_eq!(
        err(&[], &[("memory.available", "1Gi")]),
        "grace period must be specified for the soft eviction threshold memory.available"
    );
}

#[test]
fn a_threshold_is_met_below_its_amount_and_stays_until_its_minimum_reclaim() {
    let t = parse_config(
        false,
        &map(&[("memory.available", "10%")]),
        &map(&[]),
        &map(&[]),
        &map(&[("memory.available", "5%")]),
    )
    .unwrap();
    let obs = |available| {
        Observations::from([(
            Signal::MemoryAvailable,
            Observation {
                available,
                capacity: 1000,
                time: 0,
            },
        )])
    };
    assert_eq!(thresholds_met(&t, &obs(99), false).len(), 1);
    assert!(thresholds_met(&t, &obs(100), false).is_empty());
    // With the minimum reclaim, 10% + 5% must be free again.
    assert_eq!(thresholds_met(&t, &obs(140), true).len(), 1);
    assert!(thresholds_met(&t, &obs(150), true).is_empty());
}

#[test]
fn admission_under_pressure_is_upstreams() {
    let be = pod("be", None, 0);
    let burstable = pod("b", Some("10Mi"), 0);
    let mut tolerating = (*be).clone();
    tolerating.spec.as_mut().unwrap().tolerations =
        Some(vec![k8s_openapi::api::core::v1::Toleration {
            key: Some("node.kubernetes.io/memory-pressure".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
    let mut static_pod = (*be).clone();
    static_pod.metadata.annotations = Some(
        [(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    let mem = [Condition::MemoryPressure];
    assert_eq!(admit(&[], &be), Ok(()));
    assert_eq!(
        admit(&mem, &be),
        Err("The node had condition: [MemoryPressure]. ".into())
    );
    assert_eq!(admit(&mem, &burstable), Ok(()));
    assert_eq!(admit(&mem, &tolerating), Ok(()));
    assert_eq!(admit(&mem, &static_pod), Ok(()));
    // Any other condition refuses every pod but the critical ones.
    let both = [Condition::MemoryPressure, Condition::DiskPressure];
    assert_eq!(
        admit(&both, &burstable),
        Err("The node had condition: [MemoryPressure DiskPressure]. ".into())
    );
    assert_eq!(admit(&both, &static_pod), Ok(()));
}

#[test]
fn memory_pressure_ranks_pods_over_their_requests_then_by_priority_then_usage() {
    let mut pods = vec![
        pod("within", Some("100Mi"), 0),
        pod("important", None, 100),
        pod("small", None, 0),
        pod("big", None, 0),
    ];
    let stats: HashMap<String, PodStats> = [
        ("within", 50),
        ("important", 10),
        ("small", 50),
        ("big", 200),
    ]
    .into_iter()
    .map(|(n, mi)| {
        (
            format!("uid-{n}"),
            serde_json::from_value(pod_stats(n, mi * MI, 1)).unwrap(),
        )
    })
    .collect();
    rank(Signal::MemoryAvailable, &mut pods, &stats, false);
    let names: Vec<&str> = pods
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["big", "small", "important", "within"]);
}

#[test]
fn the_message_says_what_was_low_and_who_used_it_as_upstream() {
    let t = parse_config(
        false,
        &map(&[("memory.available", "100Mi")]),
        &map(&[]),
        &map(&[]),
        &map(&[]),
    )
    .unwrap();
    let s = summary(50 * MI, 1, vec![pod_stats("hog", 200 * MI, 1)]);
    let obs = observe(&s);
    let p = pod("hog", Some("64Mi"), 0);
    let (m, notes) = message(Signal::MemoryAvailable, &p, Some(&s.pods[0]), &t, &obs);
    assert_eq!(
        m,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 200Mi, request is 64Mi, has larger consumption of memory. "
    );
    // Old code: the event carried no annotations.
    let want: BTreeMap<String, String> = [
        ("offending_containers", "c"),
        ("offending_containers_usage", "200Mi"),
        ("starved_resource", "memory"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(notes, want);
    // Without stats: the message only, no annotations (upstream returns
    // before making any).
    let (_, none) = message(Signal::MemoryAvailable, &p, None, &t, &obs);
    assert!(none.is_empty());
    // A pod-level memory request: the pod's use named too.
    let mut pl = (*p).clone();
    pl.spec.as_mut().unwrap().resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(
            [(
                "memory".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("128Mi".into()),
            )]
            .into(),
        ),
        ..Default::default()
    });
    let mut ps = s.pods[0].clone();
    ps.memory = serde_json::from_value(
        serde_json::json!({"time": "2026-01-01T00:00:00Z", "workingSetBytes": 300 * MI}),
    )
    .unwrap();
    let (m, notes) = message(Signal::MemoryAvailable, &pl, Some(&ps), &t, &obs);
    assert!(
        m.contains("Pod hog was using 300Mi, request is 128Mi, has larger consumption of memory. "),
        "{m}"
    );
    assert_eq!(notes.get("offending_pod").map(String::as_str), Some("hog"));
    assert_eq!(
        notes.get("offending_pod_usage").map(String::as_str),
        Some("300Mi")
    );
}

/// A hard `memory.available<100Mi` alone, the transition period 5m.
fn memory_config() -> Config {
    Config {
        thresholds: parse_config(
            false,
            &map(&[("memory.available", "100Mi")]),
            &map(&[]),
            &map(&[]),
            &map(&[]),
        )
        .unwrap(),
        pressure_transition: Duration::from_secs(300),
        max_pod_grace: 0,
        local_storage: false,
    }
}

/// A manager over fixed figures, recording the pods it evicts.
struct Harness {
    manager: EvictionManager,
    deps: Deps,
    evicted: Arc<Mutex<Vec<(String, i64, String)>>>,
    figures: Arc<Mutex<Summary>>,
    /// How many times the pods' figures were asked for.
    pod_samples: Arc<std::sync::atomic::AtomicUsize>,
    /// The node-level reclaims asked for, in order.
    reclaims: Arc<Mutex<Vec<Reclaim>>>,
    /// The figures a reclaim of unused images leaves, if it frees anything.
    after_reclaim: Arc<Mutex<Option<Summary>>>,
}

fn harness(cfg: Config, pods: Vec<Arc<Pod>>, s: Summary) -> Harness {
    let evicted: Arc<Mutex<Vec<(String, i64, String)>>> = Default::default();
    let figures = Arc::new(Mutex::new(s));
    let (e, f, f2, gone) = (
        evicted.clone(),
        figures.clone(),
        figures.clone(),
        evicted.clone(),
    );
    let pod_samples: Arc<std::sync::atomic::AtomicUsize> = Default::default();
    let asked = pod_samples.clone();
    let reclaims: Arc<Mutex<Vec<Reclaim>>> = Default::default();
    let after_reclaim: Arc<Mutex<Option<Summary>>> = Default::default();
    let (r, after, f3) = (reclaims.clone(), after_reclaim.clone(), figures.clone());
    let deps = Deps {
        sample: Box::new(move || {
            let summary = f.lock().clone();
            Box::pin(async move {
                Some(Sample {
                    summary,
                    dedicated_image_fs: false,
                })
            })
        }),
        pod_stats: Box::new(move || {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let pods = f2.lock().pods.clone();
            Box::pin(async move { Some(pods) })
        }),
        // An evicted pod is no longer active.
        active_pods: Box::new(move || {
            let gone = gone.lock();
            let active =
                |p: &&Arc<Pod>| !gone.iter().any(|g| Some(&g.0) == p.metadata.name.as_ref());
            pods.iter().filter(active).cloned().collect()
        }),
        evict: Box::new(move |ev| {
            e.lock()
                .push((ev.pod.metadata.name.clone().unwrap(), ev.grace, ev.message));
            true
        }),
        cleaned_up: Box::new(|_| true),
        reclaim: Box::new(move |what| {
            r.lock().push(what);
            if what == Reclaim::UnusedImages {
                if let Some(s) = after.lock().take() {
                    *f3.lock() = s;
                }
            }
            Box::pin(async { Ok(()) })
        }),
        node_name: "n1".into(),
    };
    Harness {
        manager: EvictionManager::new(cfg),
        deps,
        evicted,
        figures,
        pod_samples,
        reclaims,
        after_reclaim,
    }
}

#[tokio::test(start_paused = true)]
async fn a_hard_threshold_evicts_the_first_ranked_pod_at_once_and_never_a_critical_one() {
    let cfg = memory_config();
    let mut critical = (*pod("etcd", None, 0)).clone();
    critical.metadata.annotations = Some(
        [(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    let pods = vec![
        pod("light", None, 0),
        Arc::new(critical),
        pod("heavy", None, 0),
    ];
    let s = summary(
        50 * MI,
        1,
        vec![
            pod_stats("light", 10 * MI, 1),
            pod_stats("etcd", 900 * MI, 1),
            pod_stats("heavy", 300 * MI, 1),
        ],
    );
    let h = harness(cfg, pods, s);
    let t0 = Instant::now();
    assert_eq!(h.manager.pressure(), Pressure::default());
    assert_eq!(h.manager.synchronize(&h.deps, t0).await, ["uid-heavy"]);
    assert!(h.manager.pressure().memory);
    let got = h.evicted.lock().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "heavy");
    assert_eq!(got[0].1, IMMEDIATE_GRACE);
    assert!(got[0].2.starts_with("The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 300Mi, request is 0"), "{}", got[0].2);

    // The same figures again (not newer): nobody else is evicted for them.
    assert_eq!(
        h.manager.synchronize(&h.deps, t0 + MONITORING_PERIOD).await,
        Vec::<String>::new()
    );
    // Newer figures: the next pod, passing over the critical one that
    // uses more.
    *h.figures.lock() = summary(
        50 * MI,
        2,
        vec![
            pod_stats("light", 10 * MI, 2),
            pod_stats("etcd", 900 * MI, 2),
        ],
    );
    assert_eq!(
        h.manager
            .synchronize(&h.deps, t0 + 2 * MONITORING_PERIOD)
            .await,
        ["uid-light"]
    );
    // Nothing left but the critical pod.
    *h.figures.lock() = summary(50 * MI, 3, vec![pod_stats("etcd", 900 * MI, 3)]);
    assert_eq!(
        h.manager
            .synchronize(&h.deps, t0 + 3 * MONITORING_PERIOD)
            .await,
        Vec::<String>::new()
    );
    assert_eq!(h.evicted.lock().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn pressure_outlasts_the_threshold_by_the_transition_period_and_soft_ones_wait_their_grace() {
    let cfg = Config {
        thresholds: parse_config(
            false,
            &map(&[]),
            &map(&[("pid.available", "950")]),
            &map(&[("pid.available", "30s")]),
            &map(&[]),
        )
        .unwrap(),
        pressure_transition: Duration::from_secs(60),
        max_pod_grace: 5,
        local_storage: false,
    };
    let h = harness(
        cfg,
        vec![pod("p", None, 0)],
        summary(500 * MI, 1, vec![pod_stats("p", MI, 1)]),
    );
    let t0 = Instant::now();
    // 900 pids free of 1000: below 950, but the grace period has not passed.
    assert_eq!(
        h.manager.synchronize(&h.deps, t0).await,
        Vec::<String>::new()
    );
    assert!(h.manager.pressure().pid);
    assert!(!h.manager.pressure().memory);
    // Nothing to act on yet: the pods' figures were not read.
    assert_eq!(h.pod_samples.load(std::sync::atomic::Ordering::Relaxed), 0);
    *h.figures.lock() = summary(500 * MI, 2, vec![pod_stats("p", MI, 2)]);
    assert_eq!(
        h.manager
            .synchronize(&h.deps, t0 + Duration::from_secs(30))
            .await,
        ["uid-p"]
    );
    // A soft eviction gives evictionMaxPodGracePeriod.
    assert_eq!(h.evicted.lock()[0].1, 5);

    // The pressure ends: the condition stays for the transition period.
    *h.figures.lock() = serde_json::from_value(json!({
        "node": {"nodeName": "n1", "startTime": ts(0), "rlimit": {"time": ts(3), "maxpid": 1000, "curproc": 10}},
        "pods": []
    }))
    .unwrap();
    assert_eq!(
        h.manager
            .synchronize(&h.deps, t0 + Duration::from_secs(40))
            .await,
        Vec::<String>::new()
    );
    assert!(h.manager.pressure().pid);
    assert_eq!(
        h.manager
            .synchronize(&h.deps, t0 + Duration::from_secs(91))
            .await,
        Vec::<String>::new()
    );
    assert!(!h.manager.pressure().pid);
}

#[test]
fn local_storage_limits_are_checked_in_upstreams_order_with_its_messages() {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "w", "namespace": "default", "uid": "uid-w"},
        "spec": {
            "containers": [
                {"name": "a", "image": "busybox", "resources": {"limits": {"ephemeral-storage": "10Mi"}}},
                {"name": "b", "image": "busybox", "resources": {"limits": {"ephemeral-storage": "20Mi"}}}
            ],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]
        }
    }))
    .unwrap();
    let stats = |scratch: u64, pod_total: u64, a_rootfs: u64| -> PodStats {
        serde_json::from_value(json!({
            "podRef": {"name": "w", "namespace": "default", "uid": "uid-w"},
            "startTime": ts(0),
            "containers": [
                {"name": "a", "startTime": ts(0),
                 "rootfs": {"time": ts(1), "usedBytes": a_rootfs},
                 "logs": {"time": ts(1), "usedBytes": 1024}},
                {"name": "b", "startTime": ts(0)}
            ],
            "volume": [{"time": ts(1), "name": "scratch", "usedBytes": scratch}],
            "ephemeral-storage": {"time": ts(1), "usedBytes": pod_total}
        }))
        .unwrap()
    };
    assert_eq!(
        local_storage_excess(&p, &stats(MI, 29 * MI, MI), false),
        None
    );
    assert_eq!(
        local_storage_excess(&p, &stats(2 * MI, 40 * MI, 20 * MI), false),
        Some((
            "emptydirfs.limit",
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ".into()
        ))
    );
    assert_eq!(
        local_storage_excess(&p, &stats(MI, 31 * MI, MI), false),
        Some((
            "ephemeralpodfs.limit",
            "Pod ephemeral local storage usage exceeds the total limit of containers 30Mi. ".into()
        ))
    );
    assert_eq!(
        local_storage_excess(&p, &stats(MI, 20 * MI, 10 * MI), false),
        Some((
            "ephemeralcontainerfs.limit",
            "Container a exceeded its local ephemeral storage limit \"10Mi\". ".into()
        ))
    );
    // With a dedicated image file system the writable layer is not counted.
    assert_eq!(
        local_storage_excess(&p, &stats(MI, 20 * MI, 10 * MI), true),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn a_pod_over_its_emptydir_limit_is_evicted_without_any_threshold_met() {
    let cfg = Config {
        thresholds: Vec::new(),
        pressure_transition: Duration::from_secs(300),
        max_pod_grace: 0,
        local_storage: true,
    };
    let p: Arc<Pod> = Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "w", "namespace": "default", "uid": "uid-w"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}
        }))
        .unwrap(),
    );
    let mut s = summary(500 * MI, 1, vec![pod_stats("w", MI, 1)]);
    s.pods[0].volume_stats =
        serde_json::from_value(json!([{"time": ts(1), "name": "scratch", "usedBytes": 3 * MI}]))
            .unwrap();
    let h = harness(cfg, vec![p], s);
    assert_eq!(
        h.manager.synchronize(&h.deps, Instant::now()).await,
        ["uid-w"]
    );
    assert_eq!(h.manager.pressure(), Pressure::default());
    let got = h.evicted.lock().clone();
    assert_eq!(got[0].1, IMMEDIATE_GRACE);
    assert_eq!(
        got[0].2,
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
}

#[test]
fn signals_are_observed_as_upstreams_make_signal_observations() {
    let mut s = summary(50 * MI, 1, vec![]);
    let obs = observe(&s);
    assert_eq!(
        obs[&Signal::MemoryAvailable],
        Observation {
            available: (50 * MI) as i128,
            capacity: (1050 * MI) as i128,
            time: 1_795_824_001_000_000_000,
        }
    );
    assert_eq!(obs[&Signal::PidAvailable].available, 900);
    // No limit on the pods' cgroup: no allocatable observation.
    assert!(!obs.contains_key(&Signal::AllocatableMemoryAvailable));
    s.node.system_containers = serde_json::from_value(json!([{
        "name": "pods", "startTime": ts(0),
        "memory": {"time": ts(1), "availableBytes": 10 * MI, "workingSetBytes": 90 * MI}
    }]))
    .unwrap();
    let obs = observe(&s);
    assert_eq!(
        obs[&Signal::AllocatableMemoryAvailable].available,
        (10 * MI) as i128
    );
    assert_eq!(
        obs[&Signal::AllocatableMemoryAvailable].capacity,
        (100 * MI) as i128
    );
}

/// A summary whose root file system (shared with the images) has
/// `available` of 100 GiB free.
fn disk_summary(available: u64, t: i64, pods: Vec<serde_json::Value>) -> Summary {
    let mut s = summary(500 * MI, t, pods);
    let fs = json!({"time": ts(t), "availableBytes": available, "capacityBytes": 100 * 1024 * MI});
    s.node.fs = Some(serde_json::from_value(fs.clone()).unwrap());
    s.node.runtime = Some(serde_json::from_value(json!({"imageFs": fs})).unwrap());
    s
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_first_reclaims_dead_containers_and_unused_images_and_evicts_only_if_that_is_not_enough(
) {
    let cfg = Config {
        thresholds: parse_config(
            false,
            &map(&[("nodefs.available", "10%"), ("memory.available", "100Mi")]),
            &map(&[]),
            &map(&[]),
            &map(&[("nodefs.available", "1Gi")]),
        )
        .unwrap(),
        pressure_transition: Duration::from_secs(300),
        max_pod_grace: 0,
        local_storage: false,
    };
    let pods = vec![pod("a", Some("10Mi"), 0)];
    // 5 GiB free of 100: under 10%.
    let h = harness(
        cfg,
        pods,
        disk_summary(5 * 1024 * MI, 1, vec![pod_stats("a", MI, 1)]),
    );
    // The images freed bring it to 10.5 GiB: over 10%, but short of the
    // 1 GiB minimum reclaim, so a pod still goes.
    *h.after_reclaim.lock() = Some(disk_summary(10752 * MI, 2, vec![pod_stats("a", MI, 2)]));
    let evicted = h.manager.synchronize(&h.deps, Instant::now()).await;
    assert_eq!(
        *h.reclaims.lock(),
        [Reclaim::DeadContainers, Reclaim::UnusedImages]
    );
    assert_eq!(evicted, ["uid-a"]);

    // Next time the reclaim frees enough (11 GiB ≥ 10% + 1 Gi): no pod goes.
    h.evicted.lock().clear();
    h.reclaims.lock().clear();
    *h.figures.lock() = disk_summary(5 * 1024 * MI, 3, vec![pod_stats("a", MI, 3)]);
    *h.after_reclaim.lock() = Some(disk_summary(
        11 * 1024 * MI + MI,
        4,
        vec![pod_stats("a", MI, 4)],
    ));
    tokio::time::advance(MONITORING_PERIOD).await;
    let evicted = h.manager.synchronize(&h.deps, Instant::now()).await;
    assert_eq!(h.reclaims.lock().len(), 2);
    assert!(evicted.is_empty(), "{evicted:?}");
    assert!(h.evicted.lock().is_empty());
    // DiskPressure holds still: the threshold was met this round.
    assert!(h.manager.pressure().disk);
}

#[test]
fn what_is_reclaimed_follows_the_signal_and_the_image_file_systems_device() {
    use Reclaim::*;
    assert_eq!(
        reclaim_for(Signal::NodeFsAvailable, false),
        [DeadContainers, UnusedImages]
    );
    assert_eq!(
        reclaim_for(Signal::ImageFsInodesFree, false),
        [DeadContainers, UnusedImages]
    );
    assert_eq!(
        reclaim_for(Signal::ImageFsAvailable, true),
        [DeadContainers, UnusedImages]
    );
    // With the images on their own device, freeing them cannot help the
    // root file system.
    assert!(reclaim_for(Signal::NodeFsAvailable, true).is_empty());
    assert!(reclaim_for(Signal::MemoryAvailable, false).is_empty());
    assert!(reclaim_for(Signal::PidAvailable, false).is_empty());
}

#[tokio::test(start_paused = true)]
async fn memory_pressure_reclaims_nothing_at_node_level() {
    let cfg = memory_config();
    let h = harness(
        cfg,
        vec![pod("a", None, 0)],
        summary(50 * MI, 1, vec![pod_stats("a", MI, 1)]),
    );
    let evicted = h.manager.synchronize(&h.deps, Instant::now()).await;
    assert_eq!(evicted, ["uid-a"]);
    assert!(h.reclaims.lock().is_empty());
}
