use super::topology::tests::synthetic;
use super::*;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, PodSpec,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn pod(uid: &str, cpu: Option<&str>) -> Pod {
    let resources = cpu.map(|cpu| {
        let m: BTreeMap<String, Quantity> = [
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity("64Mi".into())),
        ]
        .into();
        ResourceRequirements {
            requests: Some(m.clone()),
            limits: Some(m),
            ..Default::default()
        }
    });
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                resources,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.uid = Some(uid.into());
    p.metadata.name = Some(uid.into());
    p
}

fn running(pod: &str, c: &str, id: &str) -> Running {
    (pod.into(), c.into(), id.into())
}

#[test]
fn the_reconcile_sends_only_what_changed() {
    let mut s = State {
        default_set: set("0,2-3"),
        ..Default::default()
    };
    s.set_cpu_set("g", "app", set("1"));
    let mut last = HashMap::new();
    let live = [running("g", "app", "c1"), running("b", "app", "c2")];
    // Nothing applied yet: both get theirs.
    let p = plan(&s, &last, &live);
    assert_eq!(
        p.iter()
            .map(|u| (u.id.as_str(), u.cpus.to_string()))
            .collect::<Vec<_>>(),
        [("c1", "1".to_string()), ("c2", "0,2-3".to_string())]
    );
    for u in p {
        last.insert((u.pod, u.container), u.cpus);
    }
    assert!(plan(&s, &last, &live).is_empty());
    // A new exclusive assignment shrinks the shared pool: only the shared
    // container is sent again.
    s.default_set = set("0,3");
    s.set_cpu_set("g2", "app", set("2"));
    let p = plan(&s, &last, &live);
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].id.as_str(), p[0].cpus.to_string()),
        ("c2", "0,3".into())
    );
    // An empty cpuset is never sent.
    let empty = State::default();
    assert!(plan(&empty, &HashMap::new(), &live).is_empty());
}

#[test]
fn only_running_containers_are_reconciled() {
    let p = pod("u", None);
    let status = |state: ContainerState| PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            container_id: Some("containerd://abc".into()),
            state: Some(state),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let run = status(ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..Default::default()
    });
    assert_eq!(running_containers(&p, &run), [running("u", "app", "abc")]);
    let wait = status(ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    });
    assert!(running_containers(&p, &wait).is_empty());
}

fn config(policy: &str, root: &Path) -> Config {
    Config {
        policy: policy.into(),
        options: BTreeMap::new(),
        reconcile_period: Duration::from_secs(10),
        reserved_cpus: set("0"),
        reserved_milli: 1000,
        root_dir: root.to_path_buf(),
        alpha_options: false,
        beta_options: true,
        metrics: false,
    }
}

async fn settle(path: &Path, want: &str) {
    // The writer task runs on the blocking pool: poll with a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path:?} never had {want:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn static_policy_admits_pins_frees_and_keeps_its_file() {
    let dir = crate::testutil::tempdir("cpu-manager");
    let tasks = TaskTracker::new();
    let token = CancellationToken::new();
    // 1 socket × 2 cores × 2 threads: cores {0,2} and {1,3}.
    let topo = synthetic(1, 2, 2);
    let m = CpuManager::start(config("static", &dir), topo.clone(), &tasks, token.clone())
        .await
        .unwrap();
    let file = dir.join(state::STATE_FILE);
    settle(&file, r#""defaultCpuSet":"0-3""#).await;
    let active: Arc<Mutex<Vec<Arc<Pod>>>> = Default::default();
    let a = active.clone();
    m.set_active_pods(Box::new(move || a.lock().clone()));
    // Not before the sources are seen (a restart's pods are not back yet).
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ready.clone();
    m.set_sources_ready(Box::new(move || {
        r.load(std::sync::atomic::Ordering::SeqCst)
    }));

    let g = pod("g", Some("2"));
    assert_eq!(m.admit(&g), Ok(()));
    active.lock().push(Arc::new(g));
    // The whole free core (1,3), not the reserved CPU 0's core.
    assert_eq!(m.cpuset_for("g", "app").as_deref(), Some("1,3"));
    assert_eq!(m.cpuset_for("b", "app").as_deref(), Some("0,2"));
    settle(&file, r#""entries":{"g":{"app":"1,3"}}"#).await;
    // No room for another exclusive CPU (only reserved 0 and 2 left... 2
    // is free but 3 are asked).
    let (reason, message) = m.admit(&pod("h", Some("3"))).unwrap_err();
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert_eq!(
        message,
        "Allocate failed due to not enough cpus available to satisfy request: requested=3, available=1, which is unexpected"
    );
    // The pod leaves: its CPUs return at the next stale-state pass, once
    // the sources have been seen.
    active.lock().clear();
    let none: PodStatuses = Box::new(|_| None);
    let fake = crate::cri::fake::FakeRuntime::new();
    assert_eq!(m.reconcile(&fake, &none).await, (0, 0));
    assert_eq!(m.cpuset_for("g", "app").as_deref(), Some("1,3"));
    ready.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(m.reconcile(&fake, &none).await, (0, 0));
    assert_eq!(m.cpuset_for("b", "app").as_deref(), Some("0-3"));
    settle(
        &file,
        r#"{"policyName":"static","defaultCpuSet":"0-3","checksum":"#,
    )
    .await;
    token.cancel();
    tasks.close();
    tasks.wait().await;

    // Restarted with the other policy: upstream's refusal.
    let err = CpuManager::start(
        config("none", &dir),
        topo,
        &TaskTracker::new(),
        CancellationToken::new(),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "could not restore state from checkpoint: configured policy \"none\" differs from state checkpoint policy \"static\", please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
            file.display().to_string()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn none_policy_writes_upstreams_file_and_pins_nothing() {
    let dir = crate::testutil::tempdir("cpu-manager-none");
    let tasks = TaskTracker::new();
    let token = CancellationToken::new();
    let m = CpuManager::start(
        config("none", &dir),
        synthetic(1, 2, 2),
        &tasks,
        token.clone(),
    )
    .await
    .unwrap();
    assert_eq!(m.admit(&pod("g", Some("2"))), Ok(()));
    assert_eq!(m.cpuset_for("g", "app"), None);
    token.cancel();
    tasks.close();
    tasks.wait().await;
    assert_eq!(
        std::fs::read_to_string(dir.join(state::STATE_FILE)).unwrap(),
        r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#
    );
    // Static without a reservation, options under none: upstream's errors.
    let mut c = config("static", &dir);
    c.reserved_milli = 0;
    let err = CpuManager::start(c, synthetic(1, 2, 2), &tasks, CancellationToken::new())
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    let mut c = config("none", &dir);
    c.options.insert("full-pcpus-only".into(), "true".into());
    let err = CpuManager::start(c, synthetic(1, 2, 2), &tasks, CancellationToken::new())
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "new none policy error: None policy: received unsupported options=map[full-pcpus-only:true]"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_reconcile_updates_running_containers_once_and_retries_failures() {
    use crate::cri::RuntimeService;
    let dir = crate::testutil::tempdir("cpu-manager-reconcile");
    let tasks = TaskTracker::new();
    let token = CancellationToken::new();
    let m = CpuManager::start(
        config("static", &dir),
        synthetic(1, 2, 2),
        &tasks,
        token.clone(),
    )
    .await
    .unwrap();
    let fake = Arc::new(crate::cri::fake::FakeRuntime::new());
    let sb = fake
        .run_pod_sandbox(Default::default(), String::new())
        .await
        .unwrap();
    let config = crate::cri::v1::ContainerConfig {
        metadata: Some(crate::cri::v1::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        linux: Some(Default::default()),
        ..Default::default()
    };
    let id = fake
        .create_container(&sb, config, Default::default())
        .await
        .unwrap();
    let active: Arc<Mutex<Vec<Arc<Pod>>>> = Arc::new(Mutex::new(vec![
        Arc::new(pod("b", None)),
        Arc::new(pod("gone", None)),
    ]));
    let a = active.clone();
    m.set_active_pods(Box::new(move || a.lock().clone()));
    m.set_sources_ready(Box::new(|| true));
    let status = move |cid: &str| PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            container_id: Some(format!("containerd://{cid}")),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let (known, unknown) = (status(&id), status("missing"));
    let statuses: PodStatuses = Box::new(move |uid| match uid {
        "b" => Some(Arc::new(known.clone())),
        "gone" => Some(Arc::new(unknown.clone())),
        // No status yet: skipped, as upstream.
        _ => None,
    });
    // The shared container gets the whole pool; the container the
    // runtime no longer has fails and is tried again next time.
    assert_eq!(m.reconcile(fake.as_ref(), &statuses).await, (1, 1));
    let sent: Vec<String> = fake
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("UpdateContainerResources"))
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(m.reconcile(fake.as_ref(), &statuses).await, (0, 1));
    // A new exclusive assignment elsewhere: the shared one shrinks.
    assert_eq!(m.admit(&pod("g", Some("2"))), Ok(()));
    active.lock().push(Arc::new(pod("g", Some("2"))));
    assert_eq!(m.reconcile(fake.as_ref(), &statuses).await, (1, 1));
    assert_eq!(m.cpuset_for("b", "app").as_deref(), Some("0,2"));
    assert_eq!(m.reconcile(fake.as_ref(), &statuses).await, (0, 1));
    token.cancel();
    tasks.close();
    tasks.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
}
