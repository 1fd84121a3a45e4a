//! `/metrics` on real containerd: after a static pod runs, the kubelet's
//! own metrics show it (running pods, runtime operations, started pods and
//! containers, pod start and worker durations). Needs root and containerd
//! (scripts/setup.sh); fails, never skips, when containerd is missing.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// The value of the first sample named `name` whose labels include all of
/// `labels`.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

fn scrape(k: &Kubelet) -> Option<prometheus_parse::Scrape> {
    let (code, body) = http_get(&k.read_only, "/metrics")?;
    assert_eq!(code, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).ok()
}

#[test]
fn metrics_show_a_running_static_pod_and_its_runtime_calls() {
    let k = Kubelet::start("it-metrics");
    k.write_manifest("m.yaml", &simple_pod("m", "sleep 3600", "Always"));
    k.wait_pod("m", "Running", T, |p| running(p, "main"));

    // The running gauges come from the PLEG snapshot, which may lag the
    // status by one relist.
    let s = wait_for("kubelet_running_pods >= 1", T, || {
        let s = scrape(&k)?;
        let pods = value(&s, "kubelet_running_pods", &[])?;
        let ctrs = value(
            &s,
            "kubelet_running_containers",
            &[("container_state", "running")],
        )?;
        (pods >= 1.0 && ctrs >= 1.0).then_some(s)
    });
    for op in [
        "run_podsandbox",
        "create_container",
        "start_container",
        "list_podsandbox",
        "list_containers",
    ] {
        let n = value(
            &s,
            "kubelet_runtime_operations_total",
            &[("operation_type", op)],
        );
        assert!(n.is_some_and(|n| n >= 1.0), "{op}: {n:?}");
    }
    assert_eq!(
        value(&s, "kubelet_node_name", &[("node", "it-metrics")]),
        Some(1.0)
    );
    // The gates as set at start (featuregate's AddMetrics): GA gates have
    // an empty stage.
    assert_eq!(
        value(
            &s,
            "kubernetes_feature_enabled",
            &[("name", "KubeletCgroupDriverFromCRI"), ("stage", "")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "kubernetes_feature_enabled",
            &[("name", "PodCertificateRequest"), ("stage", "ALPHA")]
        ),
        Some(0.0)
    );
    assert!(value(&s, "kubelet_started_pods_total", &[]).is_some_and(|n| n >= 1.0));
    assert!(value(
        &s,
        "kubelet_started_containers_total",
        &[("container_type", "container")]
    )
    .is_some_and(|n| n >= 1.0));
    assert!(value(&s, "kubelet_pod_start_duration_seconds_count", &[]).is_some_and(|n| n >= 1.0));
    assert!(value(
        &s,
        "kubelet_pod_worker_duration_seconds_count",
        &[("operation_type", "create")]
    )
    .is_some_and(|n| n >= 1.0));
    assert!(value(&s, "kubelet_pleg_relist_duration_seconds_count", &[]).is_some_and(|n| n >= 1.0));
    assert!(value(&s, "kubelet_pleg_last_seen_seconds", &[]).is_some_and(|n| n > 1.6e9));
    // Earlier scrapes went through the read-only port's middleware.
    assert!(value(
        &s,
        "kubelet_http_requests_total",
        &[
            ("path", "metrics"),
            ("server_type", "readonly"),
            ("method", "GET")
        ]
    )
    .is_some_and(|n| n >= 1.0));

    // The rarer families of metrics.go: the static pod was dispatched and
    // its sandbox run through the default handler; housekeeping counted
    // it as a desired, active static pod; the rest are registered with 0.
    assert!(value(&s, "kubelet_containers_per_pod_count_count", &[]).is_some_and(|n| n >= 1.0));
    assert!(value(
        &s,
        "kubelet_run_podsandbox_duration_seconds_count",
        &[("runtime_handler", "")]
    )
    .is_some_and(|n| n >= 1.0));
    let unified = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    assert_eq!(
        value(&s, "kubelet_cgroup_version", &[]),
        Some(if unified { 2.0 } else { 1.0 })
    );
    wait_for("kubelet_desired_pods{static=true} >= 1", T, || {
        let s = scrape(&k)?;
        let d = value(&s, "kubelet_desired_pods", &[("static", "true")])?;
        let a = value(&s, "kubelet_active_pods", &[("static", "true")])?;
        let w = value(
            &s,
            "kubelet_working_pods",
            &[
                ("lifecycle", "sync"),
                ("config", "desired"),
                ("static", "true"),
            ],
        )?;
        (d >= 1.0 && a >= 1.0 && w >= 1.0).then_some(())
    });
    // The container's log usage from the pod stats (logMetricsCollector).
    assert!(
        value(
            &s,
            "kubelet_container_log_filesystem_used_bytes",
            &[("container", "main"), ("namespace", "default")]
        )
        .is_some(),
        "no log usage for the static pod's container"
    );
    for name in [
        "kubelet_mirror_pods",
        "kubelet_orphaned_runtime_pods_total",
        "kubelet_cpu_manager_pinning_requests_total",
        "kubelet_memory_manager_pinning_requests_total",
        "kubelet_topology_manager_admission_requests_total",
        "kubelet_evented_pleg_connection_error_count",
        "kubelet_node_startup_duration_seconds",
        "kubelet_graceful_shutdown_start_time_seconds",
        "kubelet_lifecycle_handler_http_fallbacks_total",
        "kubelet_sleep_action_terminated_early_total",
        "kubelet_orphan_pod_cleaned_volumes",
        "kubelet_managed_ephemeral_containers",
        // New in 1.34: nothing resized in place or user-namespaced here.
        "kubelet_pod_in_progress_resizes",
        "kubelet_started_user_namespaced_pods_total",
        "kubelet_started_user_namespaced_pods_errors_total",
        // CPU manager policy none: nothing pinned; nothing reconstructed.
        "kubelet_cpu_manager_shared_pool_size_millicores",
        "kubelet_cpu_manager_exclusive_cpu_allocation_count",
        "reconstruct_volume_operations_total",
        "force_cleaned_failed_volume_operations_total",
        // component-base registry.go: nothing disabled, hidden or
        // re-categorised; restclient's cache gauge from registration
        // (standalone: no API client built).
        "disabled_metrics_total",
        "hidden_metrics_total",
        "cardinality_enforcement_unexpected_categorizations_total",
        "rest_client_transport_cache_entries",
    ] {
        assert!(value(&s, name, &[]).is_some(), "no {name}");
    }
    for name in [
        "disabled_metrics_total",
        "hidden_metrics_total",
        "cardinality_enforcement_unexpected_categorizations_total",
        "rest_client_transport_cache_entries",
    ] {
        assert_eq!(value(&s, name, &[]), Some(0.0), "{name}");
    }
    // The kubelet's registrations by stability level (none deprecated).
    let registered = |level: &str| {
        value(
            &s,
            "registered_metrics_total",
            &[("stability_level", level), ("deprecated_version", "")],
        )
    };
    assert!(registered("ALPHA").is_some_and(|n| n > 100.0), "ALPHA");
    assert!(registered("BETA").is_some_and(|n| n >= 5.0), "BETA");
    assert_eq!(registered("INTERNAL"), Some(1.0));
    assert!(
        !s.samples
            .iter()
            .any(|x| x.metric == "rest_client_transport_create_calls_total"),
        "standalone: no client built, no transport call"
    );

    // No credential provider config: upstream registers the config-info
    // collector only with plugins.
    assert!(
        !s.samples
            .iter()
            .any(|x| x.metric.starts_with("kubelet_credential_provider_")),
        "credential provider families without plugins"
    );

    let (code, probes) = http_get(&k.read_only, "/metrics/probes").unwrap();
    assert_eq!(code, 200);
    // The pod has no probes: no series, so no prober families (Gather
    // leaves a family without series out); tests/probes.rs has them.
    assert!(!probes.contains("prober_probe"), "{probes}");
    // Upstream's probes registry also carries the process start time, in
    // seconds since the epoch: this kubelet started within the test.
    let parse = |body: &str| {
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value(&parse(&probes), "process_start_time_seconds", &[]).expect("start time");
    assert!(
        started <= now + 1.0 && now - started < 600.0,
        "{started} {now}"
    );

    // /metrics/slis: each /healthz request's checks, as upstream's
    // component-base SLIs.
    let (code, _) = http_get(&k.read_only, "/healthz").unwrap();
    assert_eq!(code, 200);
    let (code, body) = http_get(&k.read_only, "/metrics/slis").unwrap();
    assert_eq!(code, 200);
    let slis = parse(&body);
    for check in ["ping", "log", "syncloop"] {
        let ok = [("name", check), ("type", "healthz")];
        assert_eq!(
            value(&slis, "kubernetes_healthcheck", &ok),
            Some(1.0),
            "{body}"
        );
        let total = value(
            &slis,
            "kubernetes_healthchecks_total",
            &[("name", check), ("status", "success"), ("type", "healthz")],
        );
        assert!(total.is_some_and(|n| n >= 1.0), "{body}");
    }
    assert_eq!(
        value(&slis, "process_start_time_seconds", &[]),
        Some(started)
    );
    k.remove_manifest("m.yaml");
}

/// Cluster mode: the kube-rs client's requests are counted as client-go's
/// `rest_client_requests_total{code,host,method}` and timed and sized as
/// `rest_client_request_duration_seconds{host,verb}` and the size
/// histograms (the kubelet dashboard's "Get/Post Request Latency").
#[test]
fn cluster_mode_counts_api_requests() {
    use common::apiserver::{ApiServer, ApiServerOptions};
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-metrics-api";
    let mut k = Kubelet::new(node);
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec![
        "--kubeconfig".into(),
        kc.display().to_string(),
        format!("--cert-dir={}", k.dir.join("pki").display()),
    ];
    k.extra_config = "nodeStatusUpdateFrequency: 1s\n".into();
    k.spawn();
    wait_for("the Node to be registered", T, || {
        api.get("nodes", None, node)
    });
    let s = wait_for("rest_client_requests_total for GET and a write", T, || {
        let s = scrape(&k)?;
        let get = value(&s, "rest_client_requests_total", &[("method", "GET")])?;
        let write = ["POST", "PUT", "PATCH"]
            .iter()
            .filter_map(|m| value(&s, "rest_client_requests_total", &[("method", m)]))
            .sum::<f64>();
        let timed = |family: &str, verb: &str| value(&s, family, &[("verb", verb)]);
        let get_timed = timed("rest_client_request_duration_seconds_count", "GET")?;
        let write_timed = ["POST", "PUT", "PATCH"]
            .iter()
            .filter_map(|m| timed("rest_client_request_duration_seconds_count", m))
            .sum::<f64>();
        let sized = timed("rest_client_response_size_bytes_count", "GET")?
            + timed("rest_client_request_size_bytes_count", "GET")?;
        let throttled = timed("rest_client_rate_limiter_duration_seconds_count", "GET")?;
        (get >= 1.0
            && write >= 1.0
            && get_timed >= 1.0
            && write_timed >= 1.0
            && sized >= 2.0
            && throttled >= 1.0)
            .then_some(s)
    });
    let sample = s
        .samples
        .iter()
        .find(|x| x.metric == "rest_client_requests_total")
        .unwrap();
    assert!(sample.labels.get("code").is_some_and(|c| !c.is_empty()));
    let host = sample.labels.get("host").unwrap_or_default();
    assert!(host.contains(':'), "host:port of the API server: {host:?}");
    // client-go's transport cache (transport/cache.go), without
    // rotateCertificates: the kubelet's client misses and caches its
    // kubeconfig's TLS transport, the heartbeat client hits it.
    let calls = |r: &str| {
        value(
            &s,
            "rest_client_transport_create_calls_total",
            &[("result", r)],
        )
    };
    assert_eq!(calls("miss"), Some(1.0));
    assert_eq!(calls("hit"), Some(1.0));
    assert_eq!(calls("uncacheable"), None);
    assert_eq!(
        value(&s, "rest_client_transport_cache_entries", &[]),
        Some(1.0)
    );
    // This kubelet created its Node: upstream's node startup tracker sets
    // the phases, the last two once the node is Ready.
    wait_for("kubelet_node_startup_duration_seconds set", T, || {
        let s = scrape(&k)?;
        let total = value(&s, "kubelet_node_startup_duration_seconds", &[])?;
        let pre = value(&s, "kubelet_node_startup_pre_kubelet_duration_seconds", &[])?;
        let pre_reg = value(
            &s,
            "kubelet_node_startup_pre_registration_duration_seconds",
            &[],
        )?;
        (total > 0.0 && pre > 0.0 && pre_reg > 0.0 && total >= pre + pre_reg).then_some(())
    });
}

/// Upstream's readCredentialProviderConfig hash, computed apart from
/// rkubelet's: SHA-256 of each file's length (big-endian u64) and bytes.
fn expected_config_hash(files: &[&[u8]]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for f in files {
        ctx.update(&(f.len() as u64).to_be_bytes());
        ctx.update(f);
    }
    let hex: String = ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// With credential provider plugins configured, `/metrics` shows
/// `kubelet_credential_provider_config_info{hash}` for the config read at
/// start-up (pkg/credentialprovider/plugin/metrics.go, 1.34).
#[test]
fn credential_provider_config_hash_is_exposed() {
    let mut k = Kubelet::new("it-metrics-cp");
    let bin = k.dir.join("plugins");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = bin.join("noop");
    std::fs::write(&plugin, "#!/bin/sh\nexit 1\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // A directory of configs: hashed in lexical order.
    let configs = k.dir.join("credential-providers");
    std::fs::create_dir_all(&configs).unwrap();
    let a = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: noop\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  matchImages: [\"registry.invalid\"]\n  defaultCacheDuration: 1m\n";
    let b = "{\"apiVersion\": \"kubelet.config.k8s.io/v1\", \"kind\": \"CredentialProviderConfig\", \"providers\": []}\n";
    std::fs::write(configs.join("10-noop.yaml"), a).unwrap();
    std::fs::write(configs.join("20-empty.json"), b).unwrap();
    k.extra_args = vec![
        format!("--image-credential-provider-config={}", configs.display()),
        format!("--image-credential-provider-bin-dir={}", bin.display()),
    ];
    k.spawn();
    let want = expected_config_hash(&[a.as_bytes(), b.as_bytes()]);
    let s = scrape(&k).expect("a /metrics scrape");
    assert_eq!(
        value(
            &s,
            "kubelet_credential_provider_config_info",
            &[("hash", &want)]
        ),
        Some(1.0),
        "{:?}",
        s.samples
            .iter()
            .filter(|x| x.metric.starts_with("kubelet_credential_provider"))
            .collect::<Vec<_>>()
    );
}

/// The volume manager's families on real containerd: a static pod's
/// emptyDir is counted in both states under upstream's plugin name, and
/// its set-up and tear-down are timed (storage_operation_duration_seconds);
/// a standalone kubelet has no certificate manager, so no certificate
/// families (upstream registers them with rotateCertificates or
/// serverTLSBootstrap in cluster mode).
#[test]
fn volume_families_count_a_static_pods_empty_dir() {
    let k = Kubelet::start("it-metrics-vol");
    k.write_manifest(
        "v.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: v\nspec:\n  terminationGracePeriodSeconds: 2\n  volumes:\n  - name: scratch\n    emptyDir: {{}}\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'exec sleep 3600']\n    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n"
        ),
    );
    k.wait_pod("v", "Running", T, |p| running(p, "main"));
    let empty_dir = ("volume_plugin", "kubernetes.io/empty-dir");
    let s = wait_for("the emptyDir counted", T, || {
        let s = scrape(&k)?;
        let total = |state| {
            value(
                &s,
                "volume_manager_total_volumes",
                &[("plugin_name", "kubernetes.io/empty-dir"), ("state", state)],
            )
        };
        (total("actual_state_of_world")? >= 1.0 && total("desired_state_of_world")? >= 1.0)
            .then_some(s)
    });
    let mounts = value(
        &s,
        "storage_operation_duration_seconds_count",
        &[
            empty_dir,
            ("operation_name", "volume_mount"),
            ("status", "success"),
            ("migrated", "false"),
        ],
    );
    assert!(mounts.is_some_and(|n| n >= 1.0), "{mounts:?}");
    // End to end, from the mount request (operation_generator.go).
    let overall = value(
        &s,
        "volume_operation_total_seconds_count",
        &[
            ("plugin_name", "kubernetes.io/empty-dir"),
            ("operation_name", "overall_volume_mount"),
        ],
    );
    assert!(overall.is_some_and(|n| n >= 1.0), "{overall:?}");
    assert!(
        !s.samples
            .iter()
            .any(|x| x.metric.contains("certificate_manager")
                || x.metric.contains("expiration_renew")),
        "certificate families without a certificate manager"
    );
    k.remove_manifest("v.yaml");
    wait_for("the emptyDir torn down and timed", T, || {
        let s = scrape(&k)?;
        let n = value(
            &s,
            "storage_operation_duration_seconds_count",
            &[
                empty_dir,
                ("operation_name", "volume_unmount"),
                ("status", "success"),
            ],
        )?;
        (n >= 1.0).then_some(())
    });
}
