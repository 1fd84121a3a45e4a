use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use tower::{Service, ServiceExt};

use super::*;
use crate::cri::fake::FakeRuntime;
use crate::pleg::RelistPod;

async fn get_text(router: Router, path: &str) -> (String, String) {
    let resp = router
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let ct = resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (ct, String::from_utf8(body.to_vec()).unwrap())
}

/// `# TYPE` lines: family name -> type.
fn types(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (n, t) = l.split_once(' ').unwrap();
            (n.to_string(), t.to_string())
        })
        .collect()
}

fn parse(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// Label names of the samples of family `name` (`_total` for counters;
/// histograms come back from the parser under their family name).
fn label_sets(scrape: &prometheus_parse::Scrape, sample: &str) -> BTreeSet<Vec<String>> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == sample)
        .map(|s| {
            let mut k: Vec<String> = s.labels.keys().cloned().collect();
            k.sort();
            k
        })
        .collect()
}

/// Taken from upstream `pkg/kubelet/metrics/metrics.go` (kubelet
/// subsystem), `pkg/kubelet/server/metrics/metrics.go` (HTTP),
/// component-base `metrics/prometheus/restclient` (rest_client_requests_total,
/// labels code, host, method) and component-base's version collector
/// (kubernetes_build_info): (family, type, label names).
const EXPECTED: &[(&str, &str, &[&str])] = &[
    ("kubelet_node_name", "gauge", &["node"]),
    (
        "kubelet_pod_worker_duration_seconds",
        "histogram",
        &["operation_type"],
    ),
    ("kubelet_pod_start_duration_seconds", "histogram", &[]),
    (
        "kubelet_image_pull_duration_seconds",
        "histogram",
        &["image_size_in_bytes"],
    ),
    ("kubelet_pod_start_sli_duration_seconds", "histogram", &[]),
    ("kubelet_pod_start_total_duration_seconds", "histogram", &[]),
    (
        "kubelet_first_network_pod_start_sli_duration_seconds",
        "gauge",
        &[],
    ),
    (
        "kubelet_cgroup_manager_duration_seconds",
        "histogram",
        &["operation_type"],
    ),
    (
        "kubelet_pod_worker_start_duration_seconds",
        "histogram",
        &[],
    ),
    ("kubelet_pleg_relist_duration_seconds", "histogram", &[]),
    ("kubelet_pleg_discard_events", "counter", &[]),
    ("kubelet_pleg_relist_interval_seconds", "histogram", &[]),
    ("kubelet_pleg_last_seen_seconds", "gauge", &[]),
    ("kubelet_runtime_operations", "counter", &["operation_type"]),
    (
        "kubelet_runtime_operations_duration_seconds",
        "histogram",
        &["operation_type"],
    ),
    (
        "kubelet_runtime_operations_errors",
        "counter",
        &["operation_type"],
    ),
    ("kubelet_evictions", "counter", &["eviction_signal"]),
    ("kubelet_running_pods", "gauge", &[]),
    ("kubelet_running_containers", "gauge", &["container_state"]),
    ("kubelet_restarted_pods", "counter", &["static"]),
    ("kubelet_started_pods", "counter", &[]),
    ("kubelet_started_pods_errors", "counter", &[]),
    ("kubelet_started_containers", "counter", &["container_type"]),
    (
        "kubelet_started_containers_errors",
        "counter",
        &["code", "container_type"],
    ),
    (
        "kubelet_http_requests",
        "counter",
        &["long_running", "method", "path", "server_type"],
    ),
    (
        "kubelet_http_requests_duration_seconds",
        "histogram",
        &["long_running", "method", "path", "server_type"],
    ),
    (
        "kubelet_http_inflight_requests",
        "gauge",
        &["long_running", "method", "path", "server_type"],
    ),
    (
        "kubelet_volume_metric_collection_duration_seconds",
        "histogram",
        &["metric_source"],
    ),
    (
        "rest_client_request_duration_seconds",
        "histogram",
        &["host", "verb"],
    ),
    (
        "rest_client_request_size_bytes",
        "histogram",
        &["host", "verb"],
    ),
    (
        "rest_client_response_size_bytes",
        "histogram",
        &["host", "verb"],
    ),
    (
        "rest_client_rate_limiter_duration_seconds",
        "histogram",
        &["host", "verb"],
    ),
    (
        "rest_client_requests",
        "counter",
        &["code", "host", "method"],
    ),
    (
        "rest_client_request_retries",
        "counter",
        &["code", "host", "verb"],
    ),
    ("rest_client_exec_plugin_ttl_seconds", "gauge", &[]),
    (
        "rest_client_exec_plugin_certificate_rotation_age",
        "histogram",
        &[],
    ),
    (
        "rest_client_exec_plugin_call",
        "counter",
        &["call_status", "code"],
    ),
    (
        "kubernetes_build_info",
        "gauge",
        &[
            "build_date",
            "compiler",
            "git_commit",
            "git_tree_state",
            "git_version",
            "go_version",
            "major",
            "minor",
            "platform",
        ],
    ),
    // component-base metrics/prometheus/feature/metrics.go.
    ("kubernetes_feature_enabled", "gauge", &["name", "stage"]),
    ("process_cpu_seconds", "counter", &[]),
    ("process_max_fds", "gauge", &[]),
    (
        "kubelet_volume_stats_capacity_bytes",
        "gauge",
        &["namespace", "persistentvolumeclaim"],
    ),
    (
        "kubelet_volume_stats_available_bytes",
        "gauge",
        &["namespace", "persistentvolumeclaim"],
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "gauge",
        &["namespace", "persistentvolumeclaim"],
    ),
    (
        "kubelet_volume_stats_inodes",
        "gauge",
        &["namespace", "persistentvolumeclaim"],
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "gauge",
        &["namespace", "persistentvolumeclaim"],
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "gauge",
        &["namespace", "persistentvolumeclaim"],
    ),
    // pkg/credentialprovider/plugin/metrics.go (exposed once plugins
    // are registered; the test registers them).
    (
        "kubelet_credential_provider_plugin_errors",
        "counter",
        &["plugin_name"],
    ),
    (
        "kubelet_credential_provider_plugin_duration",
        "histogram",
        &["plugin_name"],
    ),
    // The rarer families of metrics.go's Register.
    ("kubelet_containers_per_pod_count", "histogram", &[]),
    ("kubelet_pod_status_sync_duration_seconds", "histogram", &[]),
    (
        "kubelet_evented_pleg_connection_error_count",
        "counter",
        &[],
    ),
    (
        "kubelet_evented_pleg_connection_success_count",
        "counter",
        &[],
    ),
    (
        "kubelet_evented_pleg_connection_latency_seconds",
        "histogram",
        &[],
    ),
    (
        "kubelet_run_podsandbox_duration_seconds",
        "histogram",
        &["runtime_handler"],
    ),
    (
        "kubelet_run_podsandbox_errors",
        "counter",
        &["runtime_handler"],
    ),
    ("kubelet_desired_pods", "gauge", &["static"]),
    ("kubelet_active_pods", "gauge", &["static"]),
    (
        "kubelet_working_pods",
        "gauge",
        &["config", "lifecycle", "static"],
    ),
    ("kubelet_mirror_pods", "gauge", &[]),
    ("kubelet_orphaned_runtime_pods", "counter", &[]),
    ("kubelet_managed_ephemeral_containers", "gauge", &[]),
    ("kubelet_cpu_manager_pinning_requests", "counter", &[]),
    ("kubelet_cpu_manager_pinning_errors", "counter", &[]),
    ("kubelet_memory_manager_pinning_requests", "counter", &[]),
    ("kubelet_memory_manager_pinning_errors", "counter", &[]),
    (
        "kubelet_topology_manager_admission_requests",
        "counter",
        &[],
    ),
    ("kubelet_topology_manager_admission_errors", "counter", &[]),
    (
        "kubelet_topology_manager_admission_duration_ms",
        "histogram",
        &[],
    ),
    ("kubelet_orphan_pod_cleaned_volumes", "gauge", &[]),
    ("kubelet_orphan_pod_cleaned_volumes_errors", "gauge", &[]),
    (
        "kubelet_node_startup_pre_kubelet_duration_seconds",
        "gauge",
        &[],
    ),
    (
        "kubelet_node_startup_pre_registration_duration_seconds",
        "gauge",
        &[],
    ),
    (
        "kubelet_node_startup_registration_duration_seconds",
        "gauge",
        &[],
    ),
    (
        "kubelet_node_startup_post_registration_duration_seconds",
        "gauge",
        &[],
    ),
    ("kubelet_node_startup_duration_seconds", "gauge", &[]),
    ("kubelet_graceful_shutdown_start_time_seconds", "gauge", &[]),
    ("kubelet_graceful_shutdown_end_time_seconds", "gauge", &[]),
    ("kubelet_lifecycle_handler_http_fallbacks", "counter", &[]),
    ("kubelet_sleep_action_terminated_early", "counter", &[]),
    ("kubelet_cgroup_version", "gauge", &[]),
    // New or changed in 1.34 (metrics.go; credentialprovider/plugin).
    ("kubelet_admission_rejections", "counter", &["reason"]),
    ("kubelet_started_user_namespaced_pods", "counter", &[]),
    (
        "kubelet_started_user_namespaced_pods_errors",
        "counter",
        &[],
    ),
    ("kubelet_cri_losing_support", "gauge", &["version"]),
    (
        "kubelet_container_requested_resizes",
        "counter",
        &["operation", "requirement", "resource"],
    ),
    (
        "kubelet_pod_resize_duration_milliseconds",
        "histogram",
        &["success"],
    ),
    ("kubelet_pod_pending_resizes", "gauge", &["reason"]),
    (
        "kubelet_pod_infeasible_resizes",
        "counter",
        &["reason_detail"],
    ),
    ("kubelet_pod_in_progress_resizes", "gauge", &[]),
    (
        "kubelet_pod_deferred_accepted_resizes",
        "counter",
        &["retry_trigger"],
    ),
    (
        "kubelet_credential_provider_config_info",
        "gauge",
        &["hash"],
    ),
    // Registered for parts rkubelet lacks (eviction, preemption, device
    // plugins, pod-resources endpoint, Windows host-process containers).
    (
        "kubelet_eviction_stats_age_seconds",
        "histogram",
        &["eviction_signal"],
    ),
    ("kubelet_preemptions", "counter", &["preemption_signal"]),
    (
        "kubelet_device_plugin_registration",
        "counter",
        &["resource_name"],
    ),
    (
        "kubelet_device_plugin_alloc_duration_seconds",
        "histogram",
        &["resource_name"],
    ),
    (
        "kubelet_pod_resources_endpoint_requests",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_pod_resources_endpoint_requests_list",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_pod_resources_endpoint_requests_get_allocatable",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_pod_resources_endpoint_errors_list",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_pod_resources_endpoint_errors_get_allocatable",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_pod_resources_endpoint_requests_get",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_pod_resources_endpoint_errors_get",
        "counter",
        &["server_api_version"],
    ),
    (
        "kubelet_started_host_process_containers",
        "counter",
        &["container_type"],
    ),
    (
        "kubelet_started_host_process_containers_errors",
        "counter",
        &["code", "container_type"],
    ),
    // The image garbage collector and DRA (images/image_gc_manager.go,
    // metrics.go): rkubelet has neither.
    ("kubelet_image_garbage_collected", "counter", &["reason"]),
    (
        "dra_operations_duration_seconds",
        "histogram",
        &["is_error", "operation_name"],
    ),
    (
        "dra_grpc_operations_duration_seconds",
        "histogram",
        &["driver_name", "grpc_status_code", "method_name"],
    ),
    ("dra_resource_claims_in_use", "gauge", &["driver_name"]),
    // The CPU manager's gauges and the alignment counters (set upstream by
    // the static policy only).
    (
        "kubelet_cpu_manager_shared_pool_size_millicores",
        "gauge",
        &[],
    ),
    (
        "kubelet_cpu_manager_exclusive_cpu_allocation_count",
        "gauge",
        &[],
    ),
    (
        "kubelet_cpu_manager_allocation_per_numa",
        "gauge",
        &["numa_node"],
    ),
    (
        "kubelet_container_aligned_compute_resources_count",
        "counter",
        &["boundary", "scope"],
    ),
    (
        "kubelet_container_aligned_compute_resources_failure_count",
        "counter",
        &["boundary", "scope"],
    ),
    // The certificate managers (kubelet.go, cmd/kubelet/app/server.go;
    // registered by the test) and the volume manager
    // (volumemanager/metrics, pkg/volume/util/metrics.go,
    // desired_state_of_world's SELinux gauges).
    (
        "kubelet_certificate_manager_client_expiration_renew_errors",
        "counter",
        &[],
    ),
    (
        "kubelet_certificate_manager_client_ttl_seconds",
        "gauge",
        &[],
    ),
    ("kubelet_server_expiration_renew_errors", "counter", &[]),
    (
        "kubelet_certificate_manager_server_rotation_seconds",
        "histogram",
        &[],
    ),
    (
        "kubelet_certificate_manager_server_ttl_seconds",
        "gauge",
        &[],
    ),
    (
        "volume_manager_total_volumes",
        "gauge",
        &["plugin_name", "state"],
    ),
    (
        "storage_operation_duration_seconds",
        "histogram",
        &["migrated", "operation_name", "status", "volume_plugin"],
    ),
    (
        "volume_operation_total_seconds",
        "histogram",
        &["operation_name", "plugin_name"],
    ),
    (
        "csi_operations_seconds",
        "histogram",
        &["driver_name", "grpc_status_code", "method_name", "migrated"],
    ),
    (
        "volume_manager_selinux_container_errors_total",
        "gauge",
        &["access_mode"],
    ),
    (
        "volume_manager_selinux_container_warnings_total",
        "gauge",
        &["access_mode"],
    ),
    (
        "volume_manager_selinux_pod_context_mismatch_errors_total",
        "gauge",
        &["access_mode"],
    ),
    (
        "volume_manager_selinux_pod_context_mismatch_warnings_total",
        "gauge",
        &["access_mode"],
    ),
    (
        "volume_manager_selinux_volume_context_mismatch_errors_total",
        "gauge",
        &["access_mode", "volume_plugin"],
    ),
    (
        "volume_manager_selinux_volume_context_mismatch_warnings_total",
        "gauge",
        &["access_mode", "volume_plugin"],
    ),
    (
        "volume_manager_selinux_volumes_admitted_total",
        "gauge",
        &["access_mode", "volume_plugin"],
    ),
    // volumemanager/metrics: the reconstruction counters.
    ("reconstruct_volume_operations", "counter", &[]),
    ("reconstruct_volume_operations_errors", "counter", &[]),
    ("force_cleaned_failed_volume_operations", "counter", &[]),
    (
        "force_cleaned_failed_volume_operation_errors",
        "counter",
        &[],
    ),
    ("process_open_fds", "gauge", &[]),
    ("process_resident_memory_bytes", "gauge", &[]),
    ("process_start_time_seconds", "gauge", &[]),
    ("process_virtual_memory_bytes", "gauge", &[]),
    // component-base registry.go's meta-metrics.
    (
        "registered_metrics",
        "counter",
        &["deprecated_version", "stability_level"],
    ),
    ("disabled_metrics", "counter", &[]),
    ("hidden_metrics", "counter", &[]),
    (
        "cardinality_enforcement_unexpected_categorizations",
        "counter",
        &[],
    ),
    // restclient/metrics.go's transport cache families.
    ("rest_client_transport_cache_entries", "gauge", &[]),
    ("rest_client_transport_create_calls", "counter", &["result"]),
];

#[tokio::test]
async fn metrics_endpoint_serves_upstream_names_types_and_labels() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    // Create one series in each labelled family, as the kubelet's paths do.
    runtime_operation("ListPodSandbox", Duration::from_millis(3), false);
    pod_worker_duration("sync", Duration::from_millis(20));
    started_container("container", Some("CreateContainerError"));
    restarted_pod(true);
    rest_client_request("200", "GET", "10.0.0.1:6443");
    rest_client_request_duration("GET", "10.0.0.1:6443", Duration::from_millis(3));
    rest_client_request_size("GET", "10.0.0.1:6443", 0);
    rest_client_response_size("GET", "10.0.0.1:6443", 900);
    rest_client_rate_limiter_duration("GET", "10.0.0.1:6443", Duration::ZERO);
    transport::client_built(&kube::Config::new("http://10.0.0.1:6443".parse().unwrap()));
    // Never counted by rkubelet: series made here for their label names.
    METRICS
        .rest_client_request_retries
        .get_or_create(&CodeHostVerb {
            code: "500".into(),
            host: "10.0.0.1:6443".into(),
            verb: "GET".into(),
        })
        .inc();
    METRICS
        .rest_client_exec_plugin_calls
        .get_or_create(&ExecPluginCall {
            call_status: "no_error".into(),
            code: "0".into(),
        })
        .inc();
    METRICS.pod_start_sli_duration.observe(1.0);
    METRICS
        .cgroup_manager_duration
        .get_or_create(&OperationType {
            operation_type: "create",
        })
        .observe(0.01);
    image_pulled(5 << 20, Duration::from_secs(3));
    volume_stats_measured("du", Duration::from_millis(2));
    run_podsandbox("", Duration::from_millis(40), false);
    set_pod_counts([(false, true), (true, true)]);
    set_working_pods([("sync", false, true, false)]);
    register_credential_provider_metrics();
    apply_feature_gates(&crate::config::KubeletConfiguration::default());
    credential_provider_plugin_run("ecr", Duration::from_millis(30), true);
    v134::set_credential_provider_config_hash("sha256:abcd1234".into());
    admission_rejected("OutOfcpu");
    // The labelled 1.34 families rkubelet never counts (no in-place
    // resize): one series each, to see the labels.
    let n = &METRICS.v134;
    cri_losing_support("1.36.0");
    n.container_requested_resizes
        .get_or_create(&v134::ResizeRequestLabels {
            operation: "increase",
            requirement: "requests",
            resource: "cpu",
        })
        .inc();
    n.pod_resize_duration_ms
        .get_or_create(&v134::SuccessLabel { success: "true" })
        .observe(42.0);
    n.pod_pending_resizes
        .get_or_create(&v134::ReasonLabel { reason: "deferred" })
        .set(0);
    n.pod_infeasible_resizes
        .get_or_create(&v134::ReasonDetailLabel {
            reason_detail: "static_pod",
        })
        .inc();
    n.pod_deferred_accepted_resizes
        .get_or_create(&v134::RetryTriggerLabel {
            retry_trigger: "pod_resized",
        })
        .inc();
    let a = &METRICS.absent;
    a.eviction_stats_age
        .get_or_create(&absent::EvictionSignalLabel {
            eviction_signal: "memory.available".into(),
        })
        .observe(1.0);
    a.preemptions
        .get_or_create(&absent::PreemptionSignal {
            preemption_signal: "cpu".into(),
        })
        .inc();
    let gpu = absent::ResourceName {
        resource_name: "example.com/gpu".into(),
    };
    a.device_plugin_registrations.get_or_create(&gpu).inc();
    a.device_plugin_alloc_duration
        .get_or_create(&gpu)
        .observe(0.01);
    for f in &a.pod_resources {
        f.get_or_create(&absent::ServerApiVersion {
            server_api_version: "v1".into(),
        })
        .inc();
    }
    a.started_host_process_containers
        .get_or_create(&ContainerType {
            container_type: "container",
        })
        .inc();
    a.started_host_process_containers_errors
        .get_or_create(&ContainerTypeCode {
            container_type: "container",
            code: "Unknown".into(),
        })
        .inc();
    a.image_garbage_collected
        .get_or_create(&absent::ReasonLabel {
            reason: "space".into(),
        })
        .inc();
    a.dra_operations_duration
        .get_or_create(&absent::DraOperationLabels {
            is_error: "false".into(),
            operation_name: "PrepareResources".into(),
        })
        .observe(0.1);
    a.dra_grpc_operations_duration
        .get_or_create(&absent::DraGrpcLabels {
            driver_name: "gpu.example.com".into(),
            grpc_status_code: "OK".into(),
            method_name: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources".into(),
        })
        .observe(0.1);
    let cmm = &METRICS.cm;
    cmm.allocation_per_numa
        .get_or_create(&cm::NumaNode {
            numa_node: "0".into(),
        })
        .set(0);
    let aligned = cm::AlignmentLabels {
        boundary: "physical_cpu",
        scope: "container",
    };
    cmm.aligned_compute_resources.get_or_create(&aligned).inc();
    cmm.aligned_compute_resources_failure
        .get_or_create(&aligned)
        .inc();
    let _ = METRICS.evictions.get_or_create(&EvictionSignal {
        eviction_signal: "memory.available".into(),
    });
    // The certificate managers run; one series in each labelled volume
    // family (the SELinux and end-to-end ones are never fed by rkubelet).
    certvol::register_certificate_manager(certvol::Cert::Client);
    certvol::register_certificate_manager(certvol::Cert::Server);
    let volumes = Arc::new(());
    let alive = Arc::downgrade(&volumes);
    certvol::add_volume_source(Box::new(move || {
        alive
            .upgrade()
            .map(|_| vec![("kubernetes.io/secret".to_string(), certvol::STATE_DESIRED)])
    }));
    certvol::storage_operation(
        "kubernetes.io/secret",
        "volume_mount",
        Duration::from_millis(5),
        true,
    );
    let cv = &*certvol::CERTVOL;
    cv.volume_operation_total_seconds
        .get_or_create(&certvol::PluginOperationLabels {
            operation_name: "volume_attach".into(),
            plugin_name: "kubernetes.io/csi:x".into(),
        })
        .observe(1.0);
    cv.csi_operations
        .get_or_create(&certvol::CsiOperationLabels {
            driver_name: "x".into(),
            grpc_status_code: "OK".into(),
            method_name: "/csi.v1.Node/NodePublishVolume".into(),
            migrated: "false".into(),
        })
        .observe(0.2);
    for f in &cv.selinux_by_mode {
        f.get_or_create(&certvol::AccessModeLabel {
            access_mode: "RWOP".into(),
        })
        .set(0);
    }
    for f in &cv.selinux_by_plugin {
        f.get_or_create(&certvol::AccessModePluginLabels {
            access_mode: "RWOP".into(),
            volume_plugin: "kubernetes.io/csi:x".into(),
        })
        .set(0);
    }
    // A claim-backed volume and one without a claim (not a series).
    let figures = |name: &str, pvc: Option<(&str, &str)>| crate::stats::volumes::VolumeFigures {
        name: name.into(),
        pvc: pvc.map(|(n, c)| (n.into(), c.into())),
        time: 0,
        capacity: 1 << 30,
        available: 1 << 29,
        used: 4096,
        inodes: 1000,
        inodes_free: 990,
        inodes_used: 10,
        abnormal: None,
        local_ephemeral: false,
    };
    state.stats.volume_stats().set(
        "u1",
        vec![
            figures("data", Some(("prod", "db"))),
            figures("scratch", None),
        ],
    );
    // Through the read-only router, so the HTTP middleware counts itself.
    let router = crate::server::read_only_router(state.clone());
    let _ = get_text(router.clone(), "/metrics").await;
    let (ct, text) = get_text(router, "/metrics").await;
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    assert!(!text.contains("# EOF"));

    let ty = types(&text);
    let scrape = parse(&text);
    for (name, want_ty, labels) in EXPECTED {
        // Upstream's sample names: counters end in _total except the two
        // upstream names without it.
        let sample = match *want_ty {
            "counter" if !COUNTERS_WITHOUT_TOTAL.contains(name) => format!("{name}_total"),
            _ => name.to_string(),
        };
        assert_eq!(
            ty.get(&sample).map(String::as_str),
            Some(*want_ty),
            "{name}"
        );
        let mut want: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        want.sort();
        let got = label_sets(&scrape, &sample);
        assert_eq!(got, BTreeSet::from([want]), "{name}: {text}");
    }
    assert!(
        text.contains("\nrest_client_exec_plugin_ttl_seconds +Inf\n"),
        "no exec plugin: +Inf, as upstream"
    );
    // Nothing else leaks into the registry.
    assert_eq!(ty.len(), EXPECTED.len(), "{ty:?}");
    assert!(text.contains(
        "kubelet_http_requests_total{long_running=\"false\",method=\"GET\",path=\"metrics\",server_type=\"readonly\"}"
    ), "{text}");
    assert!(text
        .contains("kubelet_runtime_operations_errors_total{operation_type=\"list_podsandbox\"}"));
    assert!(text.contains(
        "kubelet_volume_stats_used_bytes{namespace=\"prod\",persistentvolumeclaim=\"db\"} 4096\n"
    ), "{text}");
    assert!(text.contains(
        "# HELP kubelet_running_pods [ALPHA] Number of pods that have a running pod sandbox\n"
    ));
    assert!(text.contains(
        "# HELP kubelet_credential_provider_plugin_errors_total [ALPHA] Number of errors from credential provider plugin\n# TYPE kubelet_credential_provider_plugin_errors_total counter\n"
    ), "{text}");
    assert!(text.contains(
        "# HELP kubelet_credential_provider_plugin_duration [ALPHA] Duration of execution in seconds for credential provider plugin\n"
    ));
    // Upstream's TestKubeletCredentialProviderConfigInfo exposition (the
    // hash itself may be another test's: plugin tests load configs too).
    assert!(text.contains(
        "# HELP kubelet_credential_provider_config_info [ALPHA] Information about the last applied credential provider configuration with hash as label\n# TYPE kubelet_credential_provider_config_info gauge\nkubelet_credential_provider_config_info{hash=\"sha256:"
    ), "{text}");
    assert!(text.contains(
        "# HELP kubelet_container_requested_resizes_total [ALPHA] Number of requested resizes, counted at the container level."
    ), "{text}");
    // Upstream's names without _total keep them; the others gain it.
    assert!(
        text.contains("\nkubelet_pod_resources_endpoint_requests_list{server_api_version=\"v1\"} "),
        "{text}"
    );
    assert!(
        text.contains(
            "\nkubelet_pod_resources_endpoint_requests_total{server_api_version=\"v1\"} "
        ),
        "{text}"
    );
    assert!(
        text.contains("\nkubelet_preemptions{preemption_signal=\"cpu\"} "),
        "{text}"
    );
    // Upstream's renew-error counters have no _total.
    assert!(
        text.contains("# TYPE kubelet_server_expiration_renew_errors counter\nkubelet_server_expiration_renew_errors "),
        "{text}"
    );
    assert!(
        text.contains("\nkubelet_certificate_manager_client_expiration_renew_errors "),
        "{text}"
    );
    drop(volumes);
    assert!(
        text.contains(
            "\nkubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"} "
        ),
        "{text}"
    );
    token.cancel();
}

fn bucket_bounds(text: &str, family: &str, label: &str) -> Vec<String> {
    let prefix = format!("{family}_bucket{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .map(|l| {
            let i = l.find("le=\"").unwrap() + 4;
            let j = l[i..].find('"').unwrap();
            l[i..i + j].to_string()
        })
        .collect()
}

/// Bounds as the text writes them: Go's shortest `%g`.
fn fmt(v: &[f64]) -> Vec<String> {
    let mut out: Vec<String> = v
        .iter()
        .map(|f| golang::go_float(&format!("{f:?}")).unwrap())
        .collect();
    out.push("+Inf".into());
    out
}

#[tokio::test]
async fn histograms_use_upstream_buckets() {
    runtime_operation("Version", Duration::from_millis(1), true);
    pod_start(Duration::from_secs(1));
    pleg_relist(Duration::from_millis(5), Some(Duration::from_secs(1)), true);
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let text = render(&state);
    // metrics.ExponentialBuckets(.005, 2.5, 14), computed independently.
    let mut exp = Vec::new();
    let mut b = 0.005f64;
    for _ in 0..14 {
        exp.push(b);
        b *= 2.5;
    }
    assert_eq!(
        bucket_bounds(
            &text,
            "kubelet_runtime_operations_duration_seconds",
            "operation_type=\"version\""
        ),
        fmt(&exp)
    );
    // podStartupDurationBuckets, copied from metrics.go.
    let startup = [
        0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
        300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
    ];
    assert_eq!(
        bucket_bounds(&text, "kubelet_pod_start_duration_seconds", ""),
        fmt(&startup)
    );
    // DefBuckets.
    let def = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    assert_eq!(
        bucket_bounds(&text, "kubelet_pleg_relist_duration_seconds", ""),
        fmt(&def)
    );
    assert_eq!(
        bucket_bounds(&text, "kubelet_pleg_relist_interval_seconds", ""),
        fmt(&def)
    );
    register_credential_provider_metrics();
    credential_provider_plugin_run("gcr", Duration::from_millis(2), false);
    let text = render(&state);
    // DefBuckets (metrics.go).
    assert_eq!(
        bucket_bounds(
            &text,
            "kubelet_credential_provider_plugin_duration",
            "plugin_name=\"gcr\""
        ),
        fmt(&def)
    );
    token.cancel();
}

#[test]
fn running_counts_come_from_the_pleg_snapshot() {
    let pod = |sandbox_ready: bool, cs: &[CState]| RelistPod {
        containers: cs
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("c{i}"), *s))
            .collect(),
        sandboxes: [("s".to_string(), sandbox_ready)].into(),
    };
    let snap: crate::pleg::Snapshot = [
        (
            "a".to_string(),
            pod(true, &[CState::Running, CState::Exited]),
        ),
        ("b".to_string(), pod(true, &[CState::Running])),
        (
            "c".to_string(),
            pod(false, &[CState::Exited, CState::Created]),
        ),
    ]
    .into();
    let _g = SCRAPE.lock();
    update_running(&snap);
    let m = &*METRICS;
    let state = |s: &'static str| {
        m.running_containers
            .get_or_create(&ContainerStateLabel { container_state: s })
            .get()
    };
    assert_eq!(m.running_pods.get(), 2);
    assert_eq!(state("running"), 2);
    assert_eq!(state("exited"), 2);
    assert_eq!(state("created"), 1);
    assert_eq!(state("unknown"), 0);
}

#[test]
fn runtime_operations_count_calls_and_errors() {
    let l = OperationType {
        operation_type: "remove_image",
    };
    let m = &*METRICS;
    let (n, e) = (
        m.runtime_operations.get_or_create(&l).get(),
        m.runtime_operations_errors.get_or_create(&l).get(),
    );
    runtime_operation("RemoveImage", Duration::from_millis(1), true);
    runtime_operation("RemoveImage", Duration::from_millis(1), false);
    assert_eq!(m.runtime_operations.get_or_create(&l).get(), n + 2);
    assert_eq!(m.runtime_operations_errors.get_or_create(&l).get(), e + 1);
}

#[test]
fn http_paths_fall_into_upstream_buckets() {
    assert_eq!(http::bucket("/metrics"), "metrics");
    assert_eq!(http::bucket("/metrics/probes"), "metrics/probes");
    assert_eq!(http::bucket("/metrics/cadvisor"), "metrics/cadvisor");
    assert_eq!(http::bucket("/stats/summary"), "stats");
    assert_eq!(http::bucket("/pods"), "pods");
    assert_eq!(http::bucket("/exec/ns/pod/c"), "exec");
    assert_eq!(http::bucket("/nope"), "other");
    assert_eq!(http::bucket("/"), "other");
}

#[tokio::test]
async fn rest_client_layer_counts_by_code_method_and_host() {
    let svc = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(
            axum::http::Response::builder()
                .status(404)
                .body(())
                .unwrap(),
        )
    });
    let mut svc = tower::Layer::layer(&RestClientLayer::new("10.9.8.7:6443", None), svc);
    let l = RestClientLabels {
        code: "404".into(),
        host: "10.9.8.7:6443".into(),
        method: "PATCH".into(),
    };
    let before = METRICS.rest_client_requests.get_or_create(&l).get();
    let req = Request::patch("/api/v1/nodes/n")
        .body(Body::empty())
        .unwrap();
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(
        METRICS.rest_client_requests.get_or_create(&l).get(),
        before + 1
    );
}

#[test]
fn container_start_errors_carry_the_grpc_code() {
    let l = ContainerTypeCode {
        container_type: "init_container",
        code: "DeadlineExceeded".into(),
    };
    let before = METRICS.started_containers_errors.get_or_create(&l).get();
    let err = crate::cri::CriError::DeadlineExceeded {
        op: "CreateContainer",
    };
    started_container_result("init_container", Err(&err));
    assert_eq!(
        METRICS.started_containers_errors.get_or_create(&l).get(),
        before + 1
    );
    let unknown = crate::cri::CriError::Status {
        op: "StartContainer",
        code: tonic::Code::Cancelled,
        message: String::new(),
    };
    assert_eq!(cri_code(&unknown), "Canceled");
}

#[test]
fn pod_start_is_timed_from_config_seen_on_the_first_running_status() {
    use k8s_openapi::api::core::v1::Pod;
    let mut pod = Pod::default();
    // As the sources stamp it.
    let seen = crate::source::format_timestamp(SystemTime::now() - Duration::from_secs(2));
    pod.metadata.annotations = Some(
        [(
            crate::source::CONFIG_FIRST_SEEN_ANNOTATION.to_string(),
            seen,
        )]
        .into(),
    );
    let d = since_seen(&pod).unwrap();
    assert!(
        d >= Duration::from_secs(2) && d < Duration::from_secs(60),
        "{d:?}"
    );
    assert!(is_first_start(Some("Pending"), Some("Running")));
    assert!(is_first_start(None, Some("Running")));
    assert!(!is_first_start(Some("Running"), Some("Running")));
    assert!(!is_first_start(Some("Pending"), Some("Pending")));
    assert!(!is_first_start(Some("Running"), Some("Failed")));
    assert_eq!(since_seen(&Pod::default()), None);
}

#[tokio::test(start_paused = true)]
async fn pleg_relists_are_timed_and_dropped_events_counted() {
    use crate::cri::v1::{PodSandboxConfig, PodSandboxMetadata};
    use crate::cri::RuntimeService;
    let fake = Arc::new(FakeRuntime::new());
    for uid in ["pa", "pb", "pc"] {
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: uid.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: [(
                crate::kuberuntime::labels::POD_UID.to_string(),
                uid.to_string(),
            )]
            .into(),
            ..Default::default()
        };
        fake.run_pod_sandbox(config, String::new()).await.unwrap();
    }
    let m = &*METRICS;
    let relists = || {
        let mut out = String::new();
        let _ = encode(&mut out, &REGISTRY);
        out.lines()
            .find(|l| l.starts_with("kubelet_pleg_relist_duration_seconds_count"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap()
    };
    let (n, discarded) = (relists(), m.pleg_discard_events.get());
    // Room for one event: the three sandbox starts of the first relist
    // leave two dropped.
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let token = tokio_util::sync::CancellationToken::new();
    let h = crate::pleg::spawn(fake, Duration::from_secs(1), tx, token.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.discarded_events() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.discarded_events(), 2);
    assert!(m.pleg_discard_events.get() >= discarded + 2);
    assert!(relists() > n);
    assert!(m.pleg_last_seen.get() > 1.6e9);
    token.cancel();
}

#[test]
fn proc_stat_is_parsed_as_client_golang_does() {
    // A command name with spaces and a parenthesis, as proc(5) allows.
    let stat = "4242 (rk (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 8 0 5000 123456789 2048 18446744073709551615";
    let s = process::parse_stat(stat, 100.0, 4096.0, 1_700_000_000.0).unwrap();
    assert_eq!(
        s,
        process::Stat {
            cpu_seconds: 4.0,
            start_time: 1_700_000_050.0,
            virtual_bytes: 123456789.0,
            resident_bytes: 2048.0 * 4096.0,
        }
    );
}

#[test]
fn image_sizes_fall_in_upstreams_buckets() {
    // Upstream's GetImageSizeBucket: lower bounds exclusive, 0 is unknown.
    for (size, label) in [
        (0, "N/A"),
        (1, "0-10MB"),
        (10 << 20, "0-10MB"),
        ((10 << 20) + 1, "10MB-100MB"),
        (700 << 20, "500MB-1GB"),
        (3 << 30, "1GB-5GB"),
        (50 << 30, "40GB-60GB"),
        (200 << 30, "GT100GB"),
    ] {
        assert_eq!(image_size_bucket(size), label, "{size}");
    }
}

#[tokio::test]
async fn a_pull_is_timed_under_its_image_size_bucket() {
    // Old code had no kubelet_image_pull_duration_seconds at all.
    let fake = Arc::new(FakeRuntime::new());
    let m = crate::images::ImageManager::new(fake.clone(), true, None);
    let c = k8s_openapi::api::core::v1::Container {
        name: "a".into(),
        image: Some("registry.example/metrics-probe:1".into()),
        ..Default::default()
    };
    let count = || {
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("probe", "", METRICS.image_pull_duration.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        text.lines()
            .find(|l| l.starts_with("probe_count{image_size_in_bytes=\"N/A\"}"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .unwrap_or(0)
    };
    let before = count();
    m.ensure_image(
        &k8s_openapi::api::core::v1::Pod::default(),
        &c,
        &Default::default(),
        &[],
        Duration::from_secs(1),
    )
    .await
    .expect("pulled");
    // The fake's images have no size: upstream's "N/A". (At least one:
    // other tests pulling beside this one count there too.)
    assert!(count() > before);
}

#[test]
fn plugin_families_appear_only_once_plugins_are_registered() {
    // Upstream registers them in RegisterCredentialProviderPlugins: a
    // kubelet without plugins exposes neither family.
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    let family: Family<PluginName, Counter> = Family::default();
    family
        .get_or_create(&PluginName {
            plugin_name: "ecr".into(),
        })
        .inc();
    let mut r = Registry::default();
    r.register_collector(Box::new(Gated(
        &REGISTERED,
        Exact(vec![(
            "kubelet_credential_provider_plugin_errors",
            "h",
            Box::new(family),
        )]),
    )));
    let text = |r: &Registry| {
        let mut out = String::new();
        encode(&mut out, r).unwrap();
        to_prometheus_text(&out)
    };
    assert_eq!(text(&r), "");
    REGISTERED.store(true, Ordering::Relaxed);
    assert!(text(&r)
        .contains("kubelet_credential_provider_plugin_errors_total{plugin_name=\"ecr\"} 1\n"));
}

#[test]
fn feature_enabled_shows_every_known_gate_once_the_gates_are_set() {
    static STATES: Mutex<Option<Vec<bool>>> = Mutex::new(None);
    let mut r = Registry::default();
    r.register_collector(Box::new(FeatureInfo(&STATES)));
    let text = |r: &Registry| {
        let mut out = String::new();
        encode(&mut out, r).unwrap();
        to_prometheus_text(&out)
    };
    // Before AddMetrics the vector has no series, so no family.
    assert_eq!(text(&r), "");
    let cfg = crate::config::KubeletConfiguration {
        feature_gates: [
            ("AllAlpha".to_string(), true),
            ("KubeletFineGrainedAuthz".to_string(), false),
            ("CSIVolumeHealth".to_string(), false),
        ]
        .into(),
        ..Default::default()
    };
    *STATES.lock() = Some(feature_states(&cfg));
    let shown = text(&r);
    // Upstream's help (BETA), stage spelling (GA empty) and 1/0 values,
    // labels in client_golang's order.
    assert!(shown.starts_with(
        "# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.\n\
         # TYPE kubernetes_feature_enabled gauge\n\
         kubernetes_feature_enabled{name=\"APIResponseCompression\",stage=\"BETA\"} 1\n"
    ), "{shown}");
    for line in [
        "kubernetes_feature_enabled{name=\"AllAlpha\",stage=\"ALPHA\"} 1",
        "kubernetes_feature_enabled{name=\"AllBeta\",stage=\"BETA\"} 0",
        "kubernetes_feature_enabled{name=\"PodCertificateRequest\",stage=\"ALPHA\"} 1",
        "kubernetes_feature_enabled{name=\"CSIVolumeHealth\",stage=\"ALPHA\"} 0",
        "kubernetes_feature_enabled{name=\"KubeletFineGrainedAuthz\",stage=\"BETA\"} 0",
        "kubernetes_feature_enabled{name=\"NodeSwap\",stage=\"\"} 1",
        "kubernetes_feature_enabled{name=\"AllowServiceLBStatusOnNonLB\",stage=\"DEPRECATED\"} 0",
    ] {
        assert!(shown.contains(&format!("\n{line}\n")), "{line} in {shown}");
    }
    let names: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.strip_prefix("kubernetes_feature_enabled{name=\""))
        .map(|l| l.split('"').next().unwrap())
        .collect();
    let known: Vec<&str> = crate::config::features::GATES
        .iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(names, known, "one series per gate, sorted by name");
}

#[test]
fn dra_and_image_volume_families_follow_their_feature_gates() {
    // Defaults of 1.34: DynamicResourceAllocation on, ImageVolume off.
    let mut cfg = crate::config::KubeletConfiguration::default();
    assert_eq!(gated_families(&cfg), (true, false));
    cfg.feature_gates
        .insert("DynamicResourceAllocation".into(), false);
    cfg.feature_gates.insert("ImageVolume".into(), true);
    assert_eq!(gated_families(&cfg), (false, true));

    static ON: AtomicBool = AtomicBool::new(false);
    let m = &*METRICS;
    let mut r = Registry::default();
    r.register_collector(Box::new(Gated(
        &ON,
        Exact(m.absent.gated_by_image_volume()),
    )));
    let text = |r: &Registry| {
        let mut out = String::new();
        encode(&mut out, r).unwrap();
        to_prometheus_text(&out)
    };
    assert_eq!(text(&r), "");
    ON.store(true, Ordering::Relaxed);
    let shown = text(&r);
    for name in [
        "kubelet_image_volume_requested_total",
        "kubelet_image_volume_mounted_succeed_total",
        "kubelet_image_volume_mounted_errors_total",
    ] {
        // Plain counters: client_golang prints them at 0 once registered.
        assert!(
            shown.contains(&format!("\n{name} 0\n")),
            "{name} in {shown}"
        );
    }
}

#[test]
fn pod_counts_split_static_and_active_as_handle_pod_cleanups() {
    // (static, active)
    let (desired, active) = pod_counts([
        (false, true),
        (false, false),
        (true, true),
        (false, true),
        (true, false),
    ]);
    assert_eq!(desired, [3, 2]);
    assert_eq!(active, [2, 1]);
}

#[tokio::test]
async fn rarer_families_count_what_rkubelet_does_and_show_zero_otherwise() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let handler = "rkubelet-test-handler";
    run_podsandbox(handler, Duration::from_millis(30), true);
    run_podsandbox(handler, Duration::from_millis(300), false);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    }))
    .unwrap();
    containers_per_pod(&pod);
    set_cgroup_version(true);
    let text = render(&state);
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .map(|l| l[prefix.len()..].trim().to_string())
    };
    let h = format!("{{runtime_handler=\"{handler}\"}}");
    assert_eq!(
        line(&format!("kubelet_run_podsandbox_duration_seconds_count{h}")).as_deref(),
        Some("2")
    );
    assert_eq!(
        line(&format!("kubelet_run_podsandbox_errors_total{h}")).as_deref(),
        Some("1")
    );
    // ExponentialBuckets(1, 2, 5): 3 containers fall in le=4 and above.
    assert_eq!(
        bucket_bounds(&text, "kubelet_containers_per_pod_count", ""),
        fmt(&[1.0, 2.0, 4.0, 8.0, 16.0])
    );
    assert_eq!(
        bucket_bounds(&text, "kubelet_topology_manager_admission_duration_ms", "").len(),
        16
    );
    assert_eq!(
        bucket_bounds(&text, "kubelet_pod_status_sync_duration_seconds", ""),
        fmt(&POD_STATUS_SYNC_BUCKETS)
    );
    assert_eq!(line("kubelet_cgroup_version").as_deref(), Some("2"));
    // Counters upstream names without _total keep their names.
    assert!(text.contains("# TYPE kubelet_evented_pleg_connection_error_count counter\n"));
    assert!(text.contains("\nkubelet_evented_pleg_connection_success_count 0\n"));
    // The CPU manager's counters under its default policy (none): registered, zero.
    assert_eq!(
        line("kubelet_cpu_manager_pinning_requests_total").as_deref(),
        Some("0")
    );
    assert!(text.contains(
        "# HELP kubelet_memory_manager_pinning_errors_total [ALPHA] The number of memory pages allocations which required pinning that failed.\n"
    ));
    token.cancel();
}

/// The families metrics.go (1.34), the CPU manager, DRA and the volume
/// manager register that rkubelet lacked: the plain ones show
/// the value upstream has with rkubelet's configuration (CPU manager policy
/// none: nothing pinned, shared pool 0 as the static policy alone sets it;
/// nothing reconstructed), `_count` counters keep their names, and the
/// graceful-shutdown end gauge has 1.34's help.
#[tokio::test]
async fn families_upstream_registers_show_its_values_for_rkubelets_configuration() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let text = render(&state);
    for line in [
        "\nkubelet_cpu_manager_shared_pool_size_millicores 0\n",
        "\nkubelet_cpu_manager_exclusive_cpu_allocation_count 0\n",
        "\nreconstruct_volume_operations_total 0\n",
        "\nreconstruct_volume_operations_errors_total 0\n",
        "\nforce_cleaned_failed_volume_operations_total 0\n",
        "\nforce_cleaned_failed_volume_operation_errors_total 0\n",
        // cm/dra/claiminfo_test.go's expectation without claims.
        "# TYPE dra_resource_claims_in_use gauge\ndra_resource_claims_in_use{driver_name=\"<any>\"} 0\n",
        "# HELP kubelet_graceful_shutdown_end_time_seconds [ALPHA] Last graceful shutdown end time since unix epoch in seconds\n",
    ] {
        assert!(text.contains(line), "no {line:?} in {text}");
    }
    assert!(!text.contains("kubelet_container_aligned_compute_resources_count_total"));
    // Labelled families nothing has filled yet have no series, and Gather
    // prunes a family without series (NormalizeMetricFamilies): absent, as
    // on a Go kubelet with this configuration.
    for family in [
        "kubelet_cpu_manager_allocation_per_numa",
        "kubelet_container_aligned_compute_resources_count",
        "kubelet_container_aligned_compute_resources_failure_count",
        "dra_operations_duration_seconds",
        "dra_grpc_operations_duration_seconds",
    ] {
        assert!(!text.contains(&format!("# TYPE {family} ")), "{family}");
    }
    token.cancel();
}

#[tokio::test]
async fn container_log_sizes_come_from_the_pod_stats_and_vanish_without_them() {
    use crate::stats::provider::{ContainerRaw, PodRaw, Snapshot};
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let snap = Snapshot {
        pods: vec![PodRaw {
            name: "web".into(),
            namespace: "prod".into(),
            uid: "u-1".into(),
            containers: vec![
                ContainerRaw {
                    name: "app".into(),
                    logs: Some((8192, 3)),
                    ..Default::default()
                },
                // No log figures: no series (upstream skips nil UsedBytes).
                ContainerRaw {
                    name: "side".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = render_with(&state, Some(&snap));
    assert!(text.contains(
        "# HELP kubelet_container_log_filesystem_used_bytes [ALPHA] Bytes used by the container's logs on the filesystem.\n# TYPE kubelet_container_log_filesystem_used_bytes gauge\n"
    ), "{text}");
    let scrape = parse(&text);
    let s: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "kubelet_container_log_filesystem_used_bytes")
        .collect();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].labels.get("uid"), Some("u-1"));
    assert_eq!(s[0].labels.get("namespace"), Some("prod"));
    assert_eq!(s[0].labels.get("pod"), Some("web"));
    assert_eq!(s[0].labels.get("container"), Some("app"));
    assert!(matches!(s[0].value, prometheus_parse::Value::Gauge(v) if v == 8192.0));
    // Stats unavailable: the family is absent, as client_golang omits a
    // collector's family with no metrics.
    let text = render_with(&state, None);
    assert!(!text.contains("kubelet_container_log_filesystem_used_bytes"));
    token.cancel();
}

/// volume_stats.go: kubelet_volume_stats_health_status_abnormal is 1 for
/// a claim whose volume condition is abnormal, 0 for a normal one, and no
/// series for a volume whose stats carry no condition; with none carrying
/// one (CSIVolumeHealth off, the default) the family is absent, as
/// client_golang writes no family without samples. The old code had no
/// such family.
#[tokio::test]
async fn volume_health_is_a_series_only_for_volumes_with_a_condition() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let figures = |claim: &str, abnormal| crate::stats::volumes::VolumeFigures {
        name: claim.into(),
        pvc: Some(("prod".into(), claim.into())),
        time: 0,
        capacity: 10,
        available: 5,
        used: 5,
        inodes: 0,
        inodes_free: 0,
        inodes_used: 0,
        abnormal,
        local_ephemeral: false,
    };
    state.stats.volume_stats().set(
        "u-health",
        vec![
            figures("sick", Some(true)),
            figures("fine", Some(false)),
            figures("plain", None),
        ],
    );
    let text = render(&state);
    assert!(text.contains(
        "# HELP kubelet_volume_stats_health_status_abnormal [ALPHA] Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy\n# TYPE kubelet_volume_stats_health_status_abnormal gauge\n"
    ), "{text}");
    let scrape = parse(&text);
    let mut got: Vec<(String, f64)> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "kubelet_volume_stats_health_status_abnormal")
        .map(|s| {
            assert_eq!(s.labels.get("namespace"), Some("prod"));
            let v = match s.value {
                prometheus_parse::Value::Gauge(v) => v,
                ref other => panic!("{other:?}"),
            };
            (
                s.labels.get("persistentvolumeclaim").unwrap().to_string(),
                v,
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, vec![("fine".into(), 0.0), ("sick".into(), 1.0)]);
    // No volume with a condition: no family.
    state
        .stats
        .volume_stats()
        .set("u-health", vec![figures("plain", None)]);
    let text = render(&state);
    assert!(
        !text.contains("kubelet_volume_stats_health_status_abnormal"),
        "{text}"
    );
    assert!(text.contains(
        "kubelet_volume_stats_used_bytes{namespace=\"prod\",persistentvolumeclaim=\"plain\"} 5\n"
    ));
    token.cancel();
}

#[test]
fn node_startup_phases_follow_upstreams_tracker() {
    let t = |s: u64| UNIX_EPOCH + Duration::from_secs(1_000_000 + s);
    let mut n = NodeStartupTracker::started(Some(t(0)), t(30));
    // Registered before any attempt: nothing (upstream needs the attempt).
    assert_eq!(n.registered_new(t(31)), None);
    // Ready before registering: nothing.
    assert_eq!(n.node_ready(t(32)), None);
    n.attempt_register(t(35));
    // A later attempt keeps the first.
    n.attempt_register(t(36));
    assert_eq!(n.registered_new(t(40)), Some((Some(30.0), 5.0, 5.0)));
    // Only the first new registration counts.
    assert_eq!(n.registered_new(t(41)), None);
    assert_eq!(n.node_ready(t(52)), Some((12.0, Some(52.0))));
    assert_eq!(n.node_ready(t(60)), None);
    // Unknown boot time: no pre-kubelet or total figures.
    let mut n = NodeStartupTracker::started(None, t(0));
    n.attempt_register(t(1));
    assert_eq!(n.registered_new(t(3)), Some((None, 1.0, 2.0)));
    assert_eq!(n.node_ready(t(4)), Some((1.0, None)));
}

#[tokio::test(start_paused = true)]
async fn pod_status_sync_is_timed_from_the_first_unsent_change() {
    let h = &METRICS.rare.pod_status_sync_duration;
    // (count, sum); other tests only add to both.
    let read = || {
        let mut out = String::new();
        let mut r = Registry::default();
        r.register("h", "", h.clone());
        encode(&mut out, &r).unwrap();
        let get = |k: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().parse::<f64>().unwrap())
                .unwrap()
        };
        (get("h_count "), get("h_sum "))
    };
    let (c0, s0) = read();
    pod_status_pending("u-sync");
    tokio::time::advance(Duration::from_millis(300)).await;
    // A second change before the write keeps the first change's time.
    pod_status_pending("u-sync");
    tokio::time::advance(Duration::from_millis(200)).await;
    pod_status_synced("u-sync");
    let (c1, s1) = read();
    assert!(c1 >= c0 + 1.0);
    assert!(s1 - s0 >= 0.5 - 1e-9, "{s0} -> {s1}");
    // A dropped status is never observed, and nothing stays pending.
    pod_status_pending("u-gone");
    pod_status_dropped("u-gone");
    pod_status_synced("u-gone");
    assert!(!STATUS_PENDING.lock().contains_key("u-sync"));
    assert!(!STATUS_PENDING.lock().contains_key("u-gone"));
}

#[test]
fn managed_ephemeral_containers_sum_the_pod_specs() {
    let pod = |n: usize| {
        let ecs: Vec<serde_json::Value> = (0..n)
            .map(|i| serde_json::json!({"name": format!("debug-{i}")}))
            .collect();
        Arc::new(
            serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "a"}], "ephemeralContainers": ecs}
            }))
            .unwrap(),
        )
    };
    assert_eq!(ephemeral_containers(&[pod(2), pod(0), pod(1)]), 3);
    assert_eq!(ephemeral_containers(&[]), 0);
}

#[test]
fn working_pods_fill_upstreams_fifteen_series() {
    let counts = working_pod_counts([
        // (lifecycle, orphan, has a spec, static)
        ("sync", false, true, false),
        ("sync", false, true, false),
        ("sync", false, true, true),
        ("terminating", true, true, false),
        ("terminated", true, false, false),
    ]);
    assert_eq!(counts.len(), 15);
    let get = |lifecycle: &str, config: &str, st: &str| {
        counts
            .iter()
            .find(|(l, _)| l.lifecycle == lifecycle && l.config == config && l.r#static == st)
            .map(|(_, n)| *n)
    };
    assert_eq!(get("sync", "desired", ""), Some(2));
    assert_eq!(get("sync", "desired", "true"), Some(1));
    assert_eq!(get("terminating", "orphan", ""), Some(1));
    assert_eq!(get("terminated", "runtime_only", "unknown"), Some(1));
    assert_eq!(get("sync", "runtime_only", "unknown"), Some(0));
    assert_eq!(counts.iter().map(|(_, n)| n).sum::<i64>(), 5);
    assert_eq!(
        worker_lifecycle(crate::podworkers::WorkerPhase::Terminating),
        "terminating"
    );
}

#[tokio::test]
async fn families_new_in_1_34_have_upstreams_buckets_and_zero_values() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    METRICS
        .v134
        .pod_resize_duration_ms
        .get_or_create(&v134::SuccessLabel { success: "false" })
        .observe(750.0);
    let text = render(&state);
    // metrics.go (1.34): 10ms .. 10min.
    let ms = [
        10.0, 50.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 30000.0, 60000.0,
        120000.0, 300000.0, 600000.0,
    ];
    let bounds: Vec<String> = text
        .lines()
        .filter(|l| {
            l.starts_with("kubelet_pod_resize_duration_milliseconds_bucket{")
                && l.contains("success=\"false\"")
        })
        .map(|l| {
            let i = l.find("le=\"").unwrap() + 4;
            let j = l[i..].find('"').unwrap();
            l[i..i + j].to_string()
        })
        .collect();
    assert_eq!(bounds, fmt(&ms));
    // 750 ms falls in le=1000 and above, not in le=500.
    assert!(
        text.contains(
            "kubelet_pod_resize_duration_milliseconds_bucket{success=\"false\",le=\"500\"} 0\n"
        ),
        "{text}"
    );
    // Unlabelled families show a value from the start: rkubelet starts no
    // pod in a user namespace; resizes in progress are whatever other
    // tests left (the registry is the process's).
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .map(|l| l[name.len()..].trim().to_string())
    };
    assert!(value("kubelet_pod_in_progress_resizes").is_some_and(|v| v.parse::<i64>().is_ok()));
    assert_eq!(
        value("kubelet_started_user_namespaced_pods_total").as_deref(),
        Some("0")
    );
    assert_eq!(
        value("kubelet_started_user_namespaced_pods_errors_total").as_deref(),
        Some("0")
    );
    token.cancel();
}

#[test]
fn admission_rejections_keep_upstreams_reasons_and_fold_the_rest() {
    use v134::admission_rejection_label as label;
    assert_eq!(label("OutOfcpu"), "OutOfcpu");
    assert_eq!(label("OutOfpods"), "OutOfpods");
    assert_eq!(label("PodOSNotSupported"), "PodOSNotSupported");
    assert_eq!(label("OutOfexample.com/gpu"), "OutOfExtendedResources");
    assert_eq!(label("NodeAffinity"), "Other");
    assert_eq!(label("NodePorts"), "Other");
    let l = v134::ReasonLabel {
        reason: "PodOSSelectorNodeLabelDoesNotMatch",
    };
    let before = METRICS.v134.admission_rejections.get_or_create(&l).get();
    admission_rejected("PodOSSelectorNodeLabelDoesNotMatch");
    assert_eq!(
        METRICS.v134.admission_rejections.get_or_create(&l).get(),
        before + 1
    );
}

#[test]
fn credential_provider_config_hash_is_upstreams_length_prefixed_sha256() {
    // Computed apart: sha256(be_u64(3) || "abc").
    assert_eq!(
        v134::config_hash([b"abc".as_slice()]),
        "sha256:c3494ca1a2cf8eeb8a11ded316fb55b83c3bbbedb6313cd50415251e5d09e12f"
    );
    // A directory: its *.json/*.yaml/*.yml files in lexical order, each
    // length-prefixed; other files and subdirectories are not hashed.
    let dir = std::env::temp_dir().join(format!("rkubelet-cp-hash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("d.yaml")).unwrap();
    std::fs::write(dir.join("b.yaml"), "a: 1\n").unwrap();
    std::fs::write(dir.join("a.json"), "{}").unwrap();
    std::fs::write(dir.join("c.txt"), "ignored").unwrap();
    // The files and bytes the credential provider loader reads and hashes.
    let hash_of = |path: &std::path::Path| {
        let files = crate::images::credentialprovider::config_files(path).unwrap();
        let data: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
        v134::config_hash(data.iter().map(Vec::as_slice))
    };
    assert_eq!(
        hash_of(&dir),
        "sha256:dec125761ba96f51cd4bd2471a0c3454d1075816304590abae123d8fd119121b"
    );
    // A single file hashes alone.
    assert_eq!(
        hash_of(&dir.join("b.yaml")),
        v134::config_hash([b"a: 1\n".as_slice()])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn credential_provider_config_info_appears_only_with_a_hash() {
    static STORE: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);
    let mut r = Registry::default();
    r.register_collector(Box::new(v134::ConfigInfo(&STORE)));
    let text = |r: &Registry| {
        let mut out = String::new();
        encode(&mut out, r).unwrap();
        to_prometheus_text(&out)
    };
    assert_eq!(text(&r), "");
    *STORE.lock() = Some("sha256:00ff".into());
    assert_eq!(
        text(&r),
        "# HELP kubelet_credential_provider_config_info [ALPHA] Information about the last applied credential provider configuration with hash as label\n# TYPE kubelet_credential_provider_config_info gauge\nkubelet_credential_provider_config_info{hash=\"sha256:00ff\"} 1\n"
    );
}

/// The value of the unlabelled sample `name` in `text`.
fn sample_value(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .map(|l| l[name.len()..].trim().to_string())
}

#[tokio::test]
async fn certificate_ttls_come_from_not_after_and_errors_and_rotations_count() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    use certvol::Cert::{Client, Server};
    certvol::register_certificate_manager(Client);
    certvol::register_certificate_manager(Server);
    // A certificate valid until 2099: the TTL is the whole seconds left.
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["n1".into()]).unwrap();
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let pem = p.self_signed(&key).unwrap().pem();
    let na = crate::certificate::not_after(pem.as_bytes()).unwrap();
    let now = crate::kuberuntime::wall_now().as_secs() as i64;
    certvol::set_certificate_not_after(Client, Some(na));
    // An expired serving certificate: negative.
    certvol::set_certificate_not_after(Server, Some(now - 100));
    let text = render(&state);
    let ttl: f64 = sample_value(&text, "kubelet_certificate_manager_client_ttl_seconds")
        .unwrap()
        .parse()
        .unwrap();
    let left = (na - now) as f64;
    assert!(
        ttl <= left && ttl >= left - 60.0 && ttl.fract() == 0.0,
        "{ttl} vs {left}"
    );
    let ttl: f64 = sample_value(&text, "kubelet_certificate_manager_server_ttl_seconds")
        .unwrap()
        .parse()
        .unwrap();
    assert!((-200.0..=-100.0).contains(&ttl), "{ttl}");
    // No certificate: +Inf, as client_golang writes it.
    certvol::set_certificate_not_after(Server, None);
    let text = render(&state);
    assert_eq!(
        sample_value(&text, "kubelet_certificate_manager_server_ttl_seconds").as_deref(),
        Some("+Inf"),
        "{text}"
    );
    // Each failed attempt is one error.
    let cv = &*certvol::CERTVOL;
    let before = cv.server.renew_errors.get();
    certvol::certificate_renew_failed(Server);
    certvol::certificate_renew_failed(Server);
    assert_eq!(cv.server.renew_errors.get(), before + 2);
    let before = cv.client.renew_errors.get();
    certvol::certificate_renew_failed(Client);
    assert_eq!(cv.client.renew_errors.get(), before + 1);
    // A rotation observes how long the old serving certificate lived
    // (2 h: in the 4 h bucket, not the 1 h one); the client manager has
    // no histogram; no old certificate, no observation.
    let bucket = |text: &str, le: &str| -> u64 {
        sample_value(
            text,
            &format!("kubelet_certificate_manager_server_rotation_seconds_bucket{{le=\"{le}\"}}"),
        )
        .unwrap()
        .parse()
        .unwrap()
    };
    let text = render(&state);
    let (h1, h4) = (bucket(&text, "3600"), bucket(&text, "14400"));
    certvol::certificate_rotated(Server, Some(1_000_000), 1_000_000.0 + 7200.0);
    certvol::certificate_rotated(Client, Some(1_000_000), 1_000_000.0 + 7200.0);
    certvol::certificate_rotated(Server, None, 1_000_000.0);
    let text = render(&state);
    assert_eq!(bucket(&text, "3600"), h1);
    assert_eq!(bucket(&text, "14400"), h4 + 1);
    // kubelet.go's buckets, a minute to four years.
    let want = [
        60.0,
        3600.0,
        14400.0,
        86400.0,
        604800.0,
        2592000.0,
        7776000.0,
        15552000.0,
        31104000.0,
        124416000.0,
    ];
    assert_eq!(
        bucket_bounds(
            &text,
            "kubelet_certificate_manager_server_rotation_seconds",
            ""
        ),
        fmt(&want)
    );
    token.cancel();
}

#[tokio::test]
async fn storage_operations_have_upstreams_labels_and_buckets() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let plugin = "kubernetes.io/csi:storage-op-test.example.com";
    certvol::storage_operation(plugin, "volume_mount", Duration::from_millis(300), false);
    certvol::storage_operation(plugin, "volume_unmount", Duration::from_millis(30), true);
    let text = render(&state);
    let failed = format!("status=\"fail-unknown\",volume_plugin=\"{plugin}\"");
    let bounds = bucket_bounds(&text, "storage_operation_duration_seconds", &failed);
    // pkg/volume/util/metrics.go.
    let want = [
        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
    ];
    // bucket_bounds wants the le label first; ours comes last.
    let bounds = if bounds.is_empty() {
        text.lines()
            .filter(|l| {
                l.starts_with("storage_operation_duration_seconds_bucket{") && l.contains(&failed)
            })
            .map(|l| {
                let i = l.find("le=\"").unwrap() + 4;
                let j = l[i..].find('"').unwrap();
                l[i..i + j].to_string()
            })
            .collect()
    } else {
        bounds
    };
    assert_eq!(bounds, fmt(&want));
    assert!(text.contains(&format!(
        "storage_operation_duration_seconds_count{{migrated=\"false\",operation_name=\"volume_mount\",status=\"fail-unknown\",volume_plugin=\"{plugin}\"}} 1\n"
    )), "{text}");
    assert!(text.contains(&format!(
        "storage_operation_duration_seconds_count{{migrated=\"false\",operation_name=\"volume_unmount\",status=\"success\",volume_plugin=\"{plugin}\"}} 1\n"
    )), "{text}");
    token.cancel();
}

#[test]
fn total_volumes_count_by_plugin_and_state() {
    use certvol::{STATE_ACTUAL as A, STATE_DESIRED as D};
    let entries = vec![
        ("kubernetes.io/secret".to_string(), D),
        ("kubernetes.io/secret".to_string(), D),
        ("kubernetes.io/secret".to_string(), A),
        ("kubernetes.io/csi:ebs".to_string(), D),
    ];
    let mut got: Vec<(String, &str, i64)> = certvol::total_volumes(&entries)
        .into_iter()
        .map(|(l, n)| (l.plugin_name, l.state, n))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("kubernetes.io/csi:ebs".to_string(), D, 1),
            ("kubernetes.io/secret".to_string(), A, 1),
            ("kubernetes.io/secret".to_string(), D, 2),
        ]
    );
    assert!(certvol::total_volumes(&[]).is_empty());
}

/// A node service that knows no node (NodeGetInfo: NotFound) and has no
/// capabilities; the other calls are not made.
#[derive(Clone)]
struct NoInfoNode;

#[tonic::async_trait]
impl crate::volume::csi::proto::node_server::Node for NoInfoNode {
    async fn node_expand_volume(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeExpandVolumeRequest>,
    ) -> Result<tonic::Response<crate::volume::csi::proto::NodeExpandVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_stage_volume(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeStageVolumeRequest>,
    ) -> Result<tonic::Response<crate::volume::csi::proto::NodeStageVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_unstage_volume(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeUnstageVolumeRequest>,
    ) -> Result<tonic::Response<crate::volume::csi::proto::NodeUnstageVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_publish_volume(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodePublishVolumeRequest>,
    ) -> Result<tonic::Response<crate::volume::csi::proto::NodePublishVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_unpublish_volume(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeUnpublishVolumeRequest>,
    ) -> Result<
        tonic::Response<crate::volume::csi::proto::NodeUnpublishVolumeResponse>,
        tonic::Status,
    > {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_get_volume_stats(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeGetVolumeStatsRequest>,
    ) -> Result<tonic::Response<crate::volume::csi::proto::NodeGetVolumeStatsResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_get_capabilities(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeGetCapabilitiesRequest>,
    ) -> Result<
        tonic::Response<crate::volume::csi::proto::NodeGetCapabilitiesResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn node_get_info(
        &self,
        _: tonic::Request<crate::volume::csi::proto::NodeGetInfoRequest>,
    ) -> Result<tonic::Response<crate::volume::csi::proto::NodeGetInfoResponse>, tonic::Status>
    {
        Err(tonic::Status::not_found("no such node"))
    }
}

#[tokio::test]
async fn csi_calls_are_timed_by_driver_method_and_grpc_code() {
    let (state, token) = ServerState::for_tests(Arc::new(FakeRuntime::new()));
    let dir = crate::testutil::tempdir("metrics-csi-ops");
    let sock = dir.join("csi.sock");
    crate::volume::csi::registration::tests::serve(
        tokio::net::UnixListener::bind(&sock).unwrap(),
        crate::volume::csi::proto::node_server::NodeServer::new(NoInfoNode),
    );
    let endpoint = sock.to_string_lossy().into_owned();
    certvol::csi_driver_endpoint(&endpoint, "ops-test.example.com");
    let node = crate::volume::csi::client::NodeService::new(&endpoint, Duration::from_secs(10));
    assert!(node.get_info().await.is_err());
    node.capabilities().await.unwrap();
    let text = render(&state);
    let count = |code: &str, method: &str| {
        format!(
            "csi_operations_seconds_count{{driver_name=\"ops-test.example.com\",grpc_status_code=\"{code}\",method_name=\"/csi.v1.Node/{method}\",migrated=\"false\"}} 1\n"
        )
    };
    assert!(text.contains(&count("NotFound", "NodeGetInfo")), "{text}");
    assert!(text.contains(&count("OK", "NodeGetCapabilities")), "{text}");
    token.cancel();
}

#[test]
fn infinite_values_are_written_as_client_golang_does() {
    let open =
        "# HELP g A gauge.\n# TYPE g gauge\ng inf\n# HELP h H.\n# TYPE h gauge\nh -inf\n# EOF\n";
    let text = to_prometheus_text(open);
    assert!(text.contains("\ng +Inf\n"), "{text}");
    assert!(text.contains("\nh -Inf\n"), "{text}");
}

/// A kubeconfig for an HTTPS server with `ca` (PEM) as its CA and the
/// client pair at `pair`, plus `extra` cluster fields.
fn tls_kubeconfig(ca: &str, pair: &std::path::Path, extra: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: {ca}\n{extra}users:\n- name: u\n  user:\n    client-certificate: {p}\n    client-key: {p}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        p = pair.display()
    )
}

async fn kube_config(yaml: &str) -> kube::Config {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).unwrap();
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap()
}

/// A fresh self-signed certificate and its key, PEM.
fn self_signed() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["n1".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// client-go's tlsCache.get (transport/cache.go): one key per TLS config,
/// a proxy makes the config uncacheable, a config without TLS misses each
/// time and caches nothing, and with client certificate rotation the
/// kubelet's clients never reach the cache (their config carries its own
/// Transport, pkg/kubelet/certificate/transport.go).
#[tokio::test]
async fn the_transport_cache_counts_builds_as_client_go_does() {
    use transport::{kubelet_client, lookup, Outcome, TransportCache};
    let dir = crate::testutil::tempdir("metrics-transport-cache");
    let (ca, _) = self_signed();
    let (cert, key) = self_signed();
    let pair = dir.join("pair.pem");
    std::fs::write(&pair, format!("{cert}{key}")).unwrap();
    let kubelet = kube_config(&tls_kubeconfig(&ca, &pair, "")).await;
    let mut c = TransportCache::default();

    // The kubelet's and heartbeat clients: one entry, a miss then a hit.
    let l = lookup(&kubelet);
    assert_eq!(kubelet_client(&mut c, &l, false), Some(Outcome::Miss));
    assert_eq!(kubelet_client(&mut c, &l, false), Some(Outcome::Hit));
    assert_eq!(c.entries(), 1);
    // The same kubeconfig read again keys the same.
    let again = kube_config(&tls_kubeconfig(&ca, &pair, "")).await;
    assert_eq!(c.get(&lookup(&again)), Outcome::Hit);

    // Another CA, another server name, insecure: new entries.
    let (other_ca, _) = self_signed();
    let other = kube_config(&tls_kubeconfig(&other_ca, &pair, "")).await;
    assert_eq!(c.get(&lookup(&other)), Outcome::Miss);
    let named = kube_config(&tls_kubeconfig(&ca, &pair, "    tls-server-name: api\n")).await;
    assert_eq!(c.get(&lookup(&named)), Outcome::Miss);
    assert_eq!(c.entries(), 3);

    // A proxy: tlsConfigKey gives up; the gauge does not move.
    let proxied = kube_config(&tls_kubeconfig(
        &ca,
        &pair,
        "    proxy-url: http://10.0.0.9:3128\n",
    ))
    .await;
    assert_eq!(lookup(&proxied), transport::Lookup::Uncacheable);
    assert_eq!(c.get(&lookup(&proxied)), Outcome::Uncacheable);
    assert_eq!(c.get(&lookup(&proxied)), Outcome::Uncacheable);
    assert_eq!(c.entries(), 3);

    // Plain HTTP without any TLS option: DefaultTransport, never cached.
    let plain = kube::Config::new("http://10.0.0.1:8080".parse().unwrap());
    assert_eq!(c.get(&lookup(&plain)), Outcome::Miss);
    assert_eq!(c.get(&lookup(&plain)), Outcome::Miss);
    assert_eq!(c.entries(), 3);

    // Rotation: the kubelet's clients bypass the cache entirely.
    let (rotated_ca, _) = self_signed();
    let rotated = kube_config(&tls_kubeconfig(&rotated_ca, &pair, "")).await;
    assert_eq!(kubelet_client(&mut c, &lookup(&rotated), true), None);
    assert_eq!(c.entries(), 3);
    assert_eq!(
        [Outcome::Hit, Outcome::Miss, Outcome::Uncacheable].map(|o| c.calls(o)),
        [2, 5, 2]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn sample_f64(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Building the kubelet's clients (its own and the heartbeat client) from
/// a kubeconfig is counted on /metrics: the first a miss that adds an
/// entry, the second a hit. Other tests build clients too, so the deltas
/// are lower bounds.
#[tokio::test]
async fn building_the_api_clients_is_counted_on_metrics() {
    let dir = crate::testutil::tempdir("metrics-transport-build");
    let (ca, _) = self_signed();
    let (cert, key) = self_signed();
    let pair = dir.join("pair.pem");
    std::fs::write(&pair, format!("{cert}{key}")).unwrap();
    let kc = dir.join("kubeconfig");
    std::fs::write(&kc, tls_kubeconfig(&ca, &pair, "")).unwrap();
    let text = || {
        let mut out = String::new();
        encode(&mut out, &REGISTRY).unwrap();
        to_prometheus_text(&out)
    };
    let calls = |t: &str, r: &str| {
        sample_f64(
            t,
            &format!("rest_client_transport_create_calls_total{{result=\"{r}\"}}"),
        )
    };
    let before = text();
    crate::apiclient::ApiClient::from_kubeconfig(&kc, 50, 100)
        .await
        .unwrap();
    let after = text();
    assert!(
        calls(&after, "miss") >= calls(&before, "miss") + 1.0,
        "{after}"
    );
    assert!(
        calls(&after, "hit") >= calls(&before, "hit") + 1.0,
        "{after}"
    );
    assert!(
        sample_f64(&after, "rest_client_transport_cache_entries")
            >= sample_f64(&before, "rest_client_transport_cache_entries") + 1.0,
        "{after}"
    );
    assert!(after.contains(
        "# HELP rest_client_transport_create_calls_total [ALPHA] Number of calls to get a new transport, partitioned by the result of the operation hit: obtained from the cache, miss: created and added to the cache, uncacheable: created and not cached\n# TYPE rest_client_transport_create_calls_total counter\n"
    ), "{after}");
    assert!(after.contains(
        "# HELP rest_client_transport_cache_entries [ALPHA] Number of transport entries in the internal cache.\n# TYPE rest_client_transport_cache_entries gauge\n"
    ), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stability_levels_are_read_from_the_annotated_help() {
    use meta::Level;
    assert_eq!(Level::of_help(alpha!("x")), Some(Level::Alpha));
    assert_eq!(Level::of_help(beta!("x")), Some(Level::Beta));
    assert_eq!(Level::of_help("[INTERNAL] x"), Some(Level::Internal));
    assert_eq!(Level::of_help("[STABLE] x"), Some(Level::Stable));
    // Raw collectors carry no level and are not counted.
    assert_eq!(Level::of_help("Start time of the process"), None);
    assert_eq!(Level::of_help("[OTHER] x"), None);
}

/// lazyMetric.Create counts a registration once it happens: a gated list
/// counts while its gate is on; custom collectors never count.
#[test]
fn registrations_count_by_level_once_registered() {
    static GATE: AtomicBool = AtomicBool::new(false);
    let list: Vec<Described> = vec![
        ("a", alpha!("a"), Box::new(Counter::<u64>::default())),
        ("b", beta!("b"), Box::new(Counter::<u64>::default())),
        (
            "kubelet_volume_stats_used_bytes",
            alpha!("custom collector upstream"),
            Box::new(Counter::<u64>::default()),
        ),
    ];
    let mut regs = meta::registrations(&list, None);
    regs.extend(meta::registrations(&list, Some(&GATE)));
    assert_eq!(meta::counts(&regs), [1, 1, 0, 0]);
    GATE.store(true, Ordering::Relaxed);
    assert_eq!(meta::counts(&regs), [2, 2, 0, 0]);
}

/// registered_metrics_total on /metrics counts each family shown there
/// that upstream registers as a component-base metric, by the level in
/// its help (registry.go, metric.go), plus /metrics/probes' three (BETA
/// prober_probe_total, ALPHA prober_probe_duration_seconds and
/// process_start_time_seconds) and /metrics/slis' three (STABLE
/// kubernetes_healthcheck and kubernetes_healthchecks_total, ALPHA
/// process_start_time_seconds); custom and
/// raw collectors (volume stats, log sizes, total volumes, config info,
/// DRA claims in use, process) are not counted. The other three are 0.
#[tokio::test]
async fn registered_metrics_total_counts_the_families_on_metrics_by_level() {
    // Every late registration made, so the scrape shows what is counted.
    register_credential_provider_metrics();
    apply_feature_gates(&crate::config::KubeletConfiguration::default());
    certvol::register_certificate_manager(certvol::Cert::Client);
    certvol::register_certificate_manager(certvol::Cert::Server);
    let mut out = String::new();
    encode(&mut out, &REGISTRY).unwrap();
    let text = to_prometheus_text(&out);
    let custom = [
        "kubelet_volume_stats_",
        "kubelet_container_log_filesystem_used_bytes",
        "volume_manager_total_volumes",
        "kubelet_credential_provider_config_info",
        "dra_resource_claims_in_use",
    ];
    let mut want: HashMap<&str, u64> = HashMap::from([("BETA", 1), ("ALPHA", 3), ("STABLE", 2)]);
    // Every registered family, series or not: the registry's own text
    // (the served one leaves out families without series, as Gather does).
    for l in out.lines() {
        let Some(rest) = l.strip_prefix("# HELP ") else {
            continue;
        };
        let (name, help) = rest.split_once(' ').unwrap();
        if custom.iter().any(|c| name.starts_with(c)) {
            continue;
        }
        if let Some(level) = help
            .strip_prefix('[')
            .and_then(|h| h.split_once(']'))
            .map(|(l, _)| l)
        {
            *want.entry(level).or_default() += 1;
        }
    }
    for level in ["ALPHA", "BETA", "INTERNAL", "STABLE"] {
        let got = sample_f64(
            &text,
            &format!(
                "registered_metrics_total{{deprecated_version=\"\",stability_level=\"{level}\"}}"
            ),
        );
        assert_eq!(
            got as u64,
            want.get(level).copied().unwrap_or(0),
            "{level}: {text}"
        );
    }
    assert!(want["ALPHA"] > 100 && want["BETA"] >= 5 && want["INTERNAL"] == 1);
    assert!(text.contains(
        "# HELP registered_metrics_total [BETA] The count of registered metrics broken by stability level and deprecation version.\n# TYPE registered_metrics_total counter\n"
    ), "{text}");
    for (name, help) in [
        (
            "disabled_metrics_total",
            "[BETA] The count of disabled metrics.",
        ),
        (
            "hidden_metrics_total",
            "[BETA] The count of hidden metrics.",
        ),
        (
            "cardinality_enforcement_unexpected_categorizations_total",
            "[ALPHA] The count of unexpected categorizations during cardinality enforcement.",
        ),
    ] {
        assert!(
            text.contains(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} 0\n"
            )),
            "{name}: {text}"
        );
    }
}

/// `/metrics/slis` (server.go installs `slis.SLIMetricsWithReset`): each
/// `/healthz` request records its checks there; `DELETE` answers
/// "metrics reset" and empties the registry, the start-time gauge it shares
/// with `/metrics/probes` included.
#[tokio::test]
async fn healthz_results_show_on_metrics_slis_until_a_delete_resets_them() {
    let rt = Arc::new(FakeRuntime::new());
    let (state, _t) = ServerState::for_tests(rt);
    let router = crate::server::read_only_router(state);
    let call = |method: &str, path: &str| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let router = router.clone();
        async move {
            let resp = router.oneshot(req).await.unwrap();
            let code = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            (code, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let start = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds ";
    let (code, text) = call("GET", "/metrics/slis").await;
    assert_eq!(code, StatusCode::OK);
    assert!(!text.contains("kubernetes_healthcheck"), "{text}");
    assert!(text.contains(start), "{text}");
    assert!(call("GET", "/metrics/probes").await.1.contains(start));
    // (The test state's PLEG has not relisted: /healthz may fail; ping
    // and log pass.)
    for _ in 0..2 {
        call("GET", "/healthz").await;
    }
    call("GET", "/healthz?exclude=log").await;
    let (_, text) = call("GET", "/metrics/slis").await;
    for line in [
        "# TYPE kubernetes_healthcheck gauge\n",
        "kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 1\n",
        "# TYPE kubernetes_healthchecks_total counter\n",
        "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 3\n",
        "kubernetes_healthchecks_total{name=\"log\",status=\"success\",type=\"healthz\"} 2\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }
    assert_eq!(
        call("DELETE", "/metrics/slis").await,
        (StatusCode::OK, "metrics reset\n".to_string())
    );
    assert_eq!(
        call("GET", "/metrics/slis").await,
        (StatusCode::OK, String::new())
    );
    assert!(!call("GET", "/metrics/probes")
        .await
        .1
        .contains("process_start_time_seconds"));
    call("GET", "/healthz").await;
    let (_, text) = call("GET", "/metrics/slis").await;
    assert!(
        text.contains(
            "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 1\n"
        ),
        "{text}"
    );
}

/// The metric endpoints gzip their text when asked, as upstream's
/// promhttp handlers do (component-base `metrics/http.go` leaves
/// compression on), and send it plain otherwise.
#[tokio::test]
async fn metric_endpoints_gzip_their_text_when_asked() {
    let rt = Arc::new(FakeRuntime::new());
    let (state, _t) = ServerState::for_tests(rt);
    let router = crate::server::read_only_router(state);
    for path in [
        "/metrics",
        "/metrics/probes",
        "/metrics/slis",
        "/metrics/resource",
        "/metrics/cadvisor",
    ] {
        let get = |enc: Option<&str>| {
            let mut req = Request::get(path);
            if let Some(e) = enc {
                req = req.header(header::ACCEPT_ENCODING, e);
            }
            router.clone().oneshot(req.body(Body::empty()).unwrap())
        };
        let plain = get(None).await.unwrap();
        assert_eq!(plain.status(), StatusCode::OK, "{path}");
        assert!(
            plain.headers().get(header::CONTENT_ENCODING).is_none(),
            "{path}"
        );
        let plain = axum::body::to_bytes(plain.into_body(), usize::MAX)
            .await
            .unwrap();
        let plain = String::from_utf8(plain.to_vec()).unwrap();

        let gz = get(Some("gzip")).await.unwrap();
        assert_eq!(gz.status(), StatusCode::OK, "{path}");
        assert_eq!(gz.headers()[header::CONTENT_ENCODING], "gzip", "{path}");
        assert!(gz.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"));
        let body = axum::body::to_bytes(gz.into_body(), usize::MAX)
            .await
            .unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&body[..]), &mut text)
            .unwrap_or_else(|e| panic!("{path}: not gzip: {e}"));
        // The same families (values move between the two scrapes, and
        // tests running beside this one may register late families in the
        // process-wide registry in between: none go).
        let (gz_types, plain_types) = (types(&text), types(&plain));
        assert!(
            plain_types.iter().all(|(n, t)| gz_types.get(n) == Some(t)),
            "{path}: {plain_types:?} {gz_types:?}"
        );
        assert!(!types(&text).is_empty(), "{path}");

        // An encoding upstream does not offer gets the plain text.
        let other = get(Some("br, zstd")).await.unwrap();
        assert!(
            other.headers().get(header::CONTENT_ENCODING).is_none(),
            "{path}"
        );
    }
}

/// The label names of one sample line, in the order written.
fn label_names(line: &str) -> Vec<String> {
    golang::labels(line).into_iter().map(|(n, _)| n).collect()
}

/// /metrics and /metrics/probes list their families by name, and every
/// series writes its labels sorted by name, as client_golang does
/// (`Gather`, `MakeLabelPairs`), a bucket's `le` last (its text format adds
/// it after the series' own).
#[tokio::test]
async fn series_write_their_labels_in_name_order() {
    let rt = Arc::new(FakeRuntime::new());
    let (state, _t) = ServerState::for_tests(rt);
    let router = crate::server::read_only_router(state);
    // A request counted by the HTTP middleware, and a worker duration.
    let req = Request::get("/healthz").body(Body::empty()).unwrap();
    router.clone().oneshot(req).await.unwrap();
    pod_worker_duration("sync", Duration::from_millis(5));
    let mut checked = 0;
    for path in ["/metrics", "/metrics/probes"] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&body).into_owned();
        // Families by name, as client_golang's Gather sorts them.
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP ")?.split(' ').next())
            .collect();
        let mut sorted = families.clone();
        sorted.sort();
        assert_eq!(families, sorted, "{path}");
        assert!(!families.is_empty(), "{path}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let mut names = label_names(line);
            if line.contains("_bucket{") {
                assert_eq!(names.pop().as_deref(), Some("le"), "{line}");
            }
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "{line}");
            checked += usize::from(names.len() > 1);
        }
    }
    assert!(checked > 10, "{checked} series with several labels");
}

#[test]
fn bucket_bounds_follow_the_series_labels() {
    assert_eq!(
        to_prometheus_text("h_bucket{le=\"0.5\",a=\"x,}\\\"y\",b=\"z\"} 3\n"),
        "h_bucket{a=\"x,}\\\"y\",b=\"z\",le=\"0.5\"} 3\n"
    );
    assert_eq!(
        to_prometheus_text("h_bucket{le=\"+Inf\"} 3\nh_sum{a=\"x\"} 1\n"),
        "h_bucket{le=\"+Inf\"} 3\nh_sum{a=\"x\"} 1\n"
    );
}
