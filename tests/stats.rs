//! The stats endpoints on real containerd: `/stats/summary` figures match
//! the container's own cgroup files, and `/metrics/cadvisor` and
//! `/metrics/resource` carry upstream's names, types and labels.
//! Needs root and containerd (scripts/setup.sh); fails, never skips,
//! without them. Run alone: `flock -o /tmp/rkubelet-containerd.lock cargo
//! test --test stats -- --test-threads=1`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use rkubelet::cri::RuntimeService;
use serde_json::Value;

const T: Duration = Duration::from_secs(90);

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

fn stat_field(p: &Path, key: &str) -> u64 {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The container's cgroup figures, read by the test itself: (working set,
/// cumulative cpu ns). v1: memory and cpuacct hierarchies; v2: unified.
fn cgroup_figures(cg: &str) -> (u64, u64) {
    let v1 = Path::new("/sys/fs/cgroup/memory").is_dir();
    if v1 {
        let mem = PathBuf::from("/sys/fs/cgroup/memory").join(cg);
        let usage = read_u64(&mem.join("memory.usage_in_bytes"));
        let inactive = stat_field(&mem.join("memory.stat"), "total_inactive_file");
        let cpu = read_u64(
            &PathBuf::from("/sys/fs/cgroup/cpuacct")
                .join(cg)
                .join("cpuacct.usage"),
        );
        (usage.saturating_sub(inactive), cpu)
    } else {
        let d = PathBuf::from("/sys/fs/cgroup").join(cg);
        let usage = read_u64(&d.join("memory.current"));
        let inactive = stat_field(&d.join("memory.stat"), "inactive_file");
        let cpu = stat_field(&d.join("cpu.stat"), "usage_usec") * 1000;
        (usage.saturating_sub(inactive), cpu)
    }
}

fn parse(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text")
}

/// The TYPE of each family, as written (prometheus-parse keeps only the
/// values' kinds).
fn types(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (n, t) = l.split_once(' ')?;
            Some((n.to_string(), t.to_string()))
        })
        .collect()
}

fn label_names(s: &prometheus_parse::Sample) -> BTreeSet<String> {
    s.labels.keys().map(|k| k.to_string()).collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn summary_and_metrics_match_the_container_cgroup_and_upstream_names() {
    let k = Kubelet::start("it-stats");
    // Some CPU and memory (a 16 MB file in /dev/shm, charged to the
    // container as shmem), then idle.
    k.write_manifest(
        "busy.yaml",
        &simple_pod(
            "busy",
            "head -c 16000000 /dev/zero > /dev/shm/buf; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 3600",
            "Always",
        ),
    );
    let p = k.wait_pod("busy", "Running", T, |p| running(p, "main"));
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let pod_name = format!("busy-{}", k.node);
    let ctrs = k
        .cri
        .rt
        .block_on(k.cri.client.list_containers(None))
        .unwrap();
    let ctr = ctrs
        .iter()
        .find(|c| {
            c.labels.get("io.kubernetes.pod.uid") == Some(&uid)
                && c.metadata.as_ref().is_some_and(|m| m.name == "main")
                && c.state == rkubelet::cri::ContainerState::ContainerRunning as i32
        })
        .expect("the running container");
    let cid = ctr.id.clone();
    let sandbox_id = ctr.pod_sandbox_id.clone();
    // BestEffort pod, cgroupfs driver (the test kubelet's default), as
    // rkubelet's cm::pod_cgroup_parent names it; containerd adds the id.
    let pod_cg = format!("kubepods/besteffort/pod{uid}");
    let cg = format!("{pod_cg}/{cid}");

    // Summary figures within the window of the cgroup files read just
    // before and just after the scrape. Retry until the container holds its
    // buffer (the cgroup file says so) and the summary has the container.
    let (summary, before, after) = wait_for("summary with the container", T, || {
        if cgroup_figures(&cg).0 < 12_000_000 {
            return None;
        }
        let before = cgroup_figures(&cg);
        let (code, body) = http_get(&k.read_only, "/stats/summary")?;
        let after = cgroup_figures(&cg);
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let has = v["pods"].as_array()?.iter().any(|p| {
            p["podRef"]["uid"] == uid.as_str()
                && p["containers"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["name"] == "main"))
        });
        has.then_some((v, before, after))
    });
    let pod = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["uid"] == uid.as_str())
        .unwrap();
    assert_eq!(pod["podRef"]["name"], pod_name.as_str());
    assert_eq!(pod["podRef"]["namespace"], "default");
    let c = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "main")
        .unwrap();
    let ws = c["memory"]["workingSetBytes"]
        .as_u64()
        .expect("workingSetBytes");
    let (lo, hi) = (before.0.min(after.0), before.0.max(after.0));
    // Working set moves with kernel bookkeeping between reads: allow 1 MiB
    // around the window.
    assert!(
        ws + (1 << 20) >= lo && ws <= hi + (1 << 20),
        "workingSetBytes {ws} outside [{lo}, {hi}] ± 1 MiB"
    );
    assert!(
        ws > 10_000_000,
        "the container holds a 16 MB shm file: {ws}"
    );
    let cpu = c["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .expect("usageCoreNanoSeconds");
    assert!(
        cpu >= before.1 && cpu <= after.1,
        "usageCoreNanoSeconds {cpu} outside [{}, {}]",
        before.1,
        after.1
    );
    assert!(pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() >= cpu);
    assert!(pod["memory"]["workingSetBytes"].as_u64().unwrap() >= ws / 2);
    assert!(
        pod["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty()),
        "pod network from its netns: {pod}"
    );
    assert!(c["rootfs"]["usedBytes"].is_u64(), "rootfs from CRI: {c}");
    assert!(c["logs"]["usedBytes"].is_u64(), "logs: {c}");
    assert!(c["startTime"].is_string());
    let node = &summary["node"];
    assert_eq!(node["nodeName"], k.node.as_str());
    assert!(node["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > cpu);
    assert!(node["memory"]["workingSetBytes"].as_u64().unwrap() > ws);
    assert!(node["memory"]["availableBytes"].is_u64());
    assert!(node["fs"]["capacityBytes"].as_u64().unwrap() > 0);
    assert!(
        node["runtime"]["imageFs"]["usedBytes"].is_u64(),
        "imageFs from CRI ImageFsInfo: {node}"
    );
    // containerd 1.7 reports no separate container filesystem: upstream
    // then gives the image filesystem as containerFs too.
    assert_eq!(
        node["runtime"]["containerFs"], node["runtime"]["imageFs"],
        "{node}"
    );
    assert!(node["rlimit"]["maxpid"].is_i64());

    // A second scrape a little later has a usageNanoCores (two samples).
    let with_rate = wait_for("usageNanoCores on the node", T, || {
        let (_, body) = http_get(&k.read_only, "/stats/summary?only_cpu_and_memory=true")?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["node"]["cpu"]["usageNanoCores"].as_u64().map(|_| v)
    });
    assert!(with_rate["node"]["fs"].is_null(), "only cpu and memory");

    // /metrics/cadvisor: names, types and labels from cAdvisor's
    // lib/metrics/prometheus.go (containerMetrics: valueType, extraLabels)
    // and the kubelet's containerPrometheusLabelsFunc in
    // pkg/kubelet/server/server.go (id, name, image, pod, namespace,
    // container).
    let (code, text) = http_get(&k.read_only, "/metrics/cadvisor").unwrap();
    assert_eq!(code, 200);
    let scrape = parse(&text);
    let ty = types(&text);
    let base = ["container", "id", "image", "name", "namespace", "pod"];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend_from_slice(extra);
        set(&v)
    };
    let expected: &[(&str, &str, BTreeSet<String>)] = &[
        (
            "container_cpu_usage_seconds_total",
            "counter",
            with(&["cpu"]),
        ),
        ("container_cpu_user_seconds_total", "counter", with(&[])),
        ("container_cpu_system_seconds_total", "counter", with(&[])),
        ("container_memory_working_set_bytes", "gauge", with(&[])),
        ("container_memory_usage_bytes", "gauge", with(&[])),
        ("container_memory_rss", "gauge", with(&[])),
        ("container_memory_cache", "gauge", with(&[])),
        ("container_memory_failcnt", "counter", with(&[])),
        ("container_last_seen", "gauge", with(&[])),
        ("container_start_time_seconds", "gauge", with(&[])),
        ("container_spec_cpu_shares", "gauge", with(&[])),
        ("container_spec_memory_limit_bytes", "gauge", with(&[])),
        ("container_spec_memory_swap_limit_bytes", "gauge", with(&[])),
        (
            "container_spec_memory_reservation_limit_bytes",
            "gauge",
            with(&[]),
        ),
        (
            "container_network_receive_bytes_total",
            "counter",
            with(&["interface"]),
        ),
        (
            "container_network_transmit_bytes_total",
            "counter",
            with(&["interface"]),
        ),
        ("container_fs_usage_bytes", "gauge", with(&["device"])),
        // ProcessMetrics, CpuLoadMetrics and the rest of MemoryUsageMetrics,
        // which the kubelet's /metrics/cadvisor includes (server.go).
        ("container_processes", "gauge", with(&[])),
        ("container_threads", "gauge", with(&[])),
        ("container_threads_max", "gauge", with(&[])),
        ("container_file_descriptors", "gauge", with(&[])),
        ("container_sockets", "gauge", with(&[])),
        ("container_ulimits_soft", "gauge", with(&["ulimit"])),
        ("container_cpu_load_average_10s", "gauge", with(&[])),
        ("container_tasks_state", "gauge", with(&["state"])),
        ("container_memory_kernel_usage", "gauge", with(&[])),
        (
            "container_memory_total_inactive_file_bytes",
            "gauge",
            with(&[]),
        ),
        (
            "machine_cpu_cores",
            "gauge",
            set(&["boot_id", "machine_id", "system_uuid"]),
        ),
        (
            "machine_memory_bytes",
            "gauge",
            set(&["boot_id", "machine_id", "system_uuid"]),
        ),
        // The rest of cAdvisor's prometheus_machine.go without
        // CPUTopologyMetrics (the kubelet does not include it); the dimm
        // families only where EDAC lists DIMMs.
        (
            "machine_cpu_physical_cores",
            "gauge",
            set(&["boot_id", "machine_id", "system_uuid"]),
        ),
        (
            "machine_cpu_sockets",
            "gauge",
            set(&["boot_id", "machine_id", "system_uuid"]),
        ),
        (
            "machine_swap_bytes",
            "gauge",
            set(&["boot_id", "machine_id", "system_uuid"]),
        ),
        (
            "machine_nvm_avg_power_budget_watts",
            "gauge",
            set(&["boot_id", "machine_id", "system_uuid"]),
        ),
        (
            "machine_nvm_capacity",
            "gauge",
            set(&["boot_id", "machine_id", "mode", "system_uuid"]),
        ),
        ("machine_scrape_error", "gauge", set(&[])),
        // The root container's file systems with their diskstats
        // (cAdvisor's raw handler, GetGlobalFsInfo).
        ("container_fs_limit_bytes", "gauge", with(&["device"])),
        ("container_fs_inodes_total", "gauge", with(&["device"])),
        ("container_fs_inodes_free", "gauge", with(&["device"])),
        (
            "container_fs_io_time_weighted_seconds_total",
            "counter",
            with(&["device"]),
        ),
        ("container_fs_io_current", "gauge", with(&["device"])),
        (
            "container_fs_reads_merged_total",
            "counter",
            with(&["device"]),
        ),
    ];
    for (name, t, labels) in expected {
        assert_eq!(
            ty.get(*name).map(String::as_str),
            Some(*t),
            "TYPE of {name}"
        );
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == *name)
            .unwrap_or_else(|| panic!("no {name} sample"));
        assert_eq!(&label_names(s), labels, "labels of {name}");
    }
    // The root container shows the file system holding `/` among its
    // devices (whatever its type, cAdvisor lists ext*, xfs, btrfs, overlay,
    // tmpfs, nfs and zfs mounts).
    let root_devices: BTreeSet<&str> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "container_fs_limit_bytes" && s.labels.get("id") == Some("/"))
        .filter_map(|s| s.labels.get("device"))
        .collect();
    assert!(!root_devices.is_empty(), "no file systems for id=/");
    for fam in [
        "container_fs_reads_total",
        "container_fs_writes_total",
        "container_fs_io_time_weighted_seconds_total",
    ] {
        for dev in &root_devices {
            assert!(
                scrape.samples.iter().any(|s| s.metric == fam
                    && s.labels.get("id") == Some("/")
                    && s.labels.get("device") == Some(*dev)),
                "no {fam} for / on {dev}"
            );
        }
    }
    let id = format!("/{cg}");
    let ours = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "container_memory_working_set_bytes" && s.labels.get("id") == Some(&id)
        })
        .unwrap_or_else(|| panic!("no sample with id {id}"));
    assert_eq!(
        ours.labels.get("name"),
        Some(cid.as_str()),
        "name is the container id"
    );
    assert_eq!(ours.labels.get("container"), Some("main"));
    // Process figures against the container's cgroup: its processes (the
    // cpu controller's cgroup.procs, as cAdvisor reads it) and their
    // descriptors (at least stdin, stdout and stderr each).
    let of = |metric: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && s.labels.get("id") == Some(&id))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("no {metric} for {id}"))
    };
    let procs_file = if Path::new("/sys/fs/cgroup/cpu").is_dir() {
        PathBuf::from("/sys/fs/cgroup/cpu").join(&cg)
    } else {
        PathBuf::from("/sys/fs/cgroup").join(&cg)
    }
    .join("cgroup.procs");
    let count_procs = || {
        std::fs::read_to_string(&procs_file)
            .unwrap()
            .lines()
            .count() as f64
    };
    let procs = count_procs();
    assert!(procs >= 1.0);
    // The count is kept up to 10 s, and the script forks on its way to
    // its sleep: a later scrape agrees with the cgroup once both settle.
    wait_for("container_processes as cgroup.procs counts", T, || {
        let (_, text) = http_get(&k.read_only, "/metrics/cadvisor")?;
        let n = parse(&text)
            .samples
            .into_iter()
            .find(|s| s.metric == "container_processes" && s.labels.get("id") == Some(&id))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
                _ => f64::NAN,
            })?;
        (n == count_procs()).then_some(())
    });
    assert!(of("container_file_descriptors") >= 3.0 * procs);
    assert!(of("container_threads") >= procs);
    assert_eq!(ours.labels.get("pod"), Some(pod_name.as_str()));
    assert_eq!(ours.labels.get("namespace"), Some("default"));
    assert!(
        ours.labels
            .get("image")
            .is_some_and(|i| i.contains("busybox")),
        "{:?}",
        ours.labels
    );
    // The pod's network is on its sandbox (container=""), with an interface.
    let sb_id = format!("/{pod_cg}/{sandbox_id}");
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "container_network_receive_bytes_total"
                && s.labels.get("id") == Some(&sb_id)
                && s.labels.get("container") == Some("")
                && s.labels.get("pod") == Some(pod_name.as_str())
                // The pause image, as cAdvisor labels the sandbox
                // (containerd pins it, which is how rkubelet finds it).
                && s.labels.get("image").is_some_and(|i| i.contains("pause"))),
        "sandbox network sample for {sb_id}"
    );
    // The pod cgroup itself: pod and namespace, no container.
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "container_cpu_usage_seconds_total"
            && s.labels.get("id") == Some(format!("/{pod_cg}").as_str())
            && s.labels.get("pod") == Some(pod_name.as_str())
            && s.labels.get("container") == Some("")));

    // /metrics/resource: pkg/kubelet/metrics/collectors/resource_metrics.go
    // (descriptors: name, labels; CounterValue/GaugeValue in the collect
    // functions).
    let (code, text) = http_get(&k.read_only, "/metrics/resource").unwrap();
    assert_eq!(code, 200);
    let scrape = parse(&text);
    let ty = types(&text);
    let cpn = set(&["container", "pod", "namespace"]);
    let pn = set(&["pod", "namespace"]);
    let expected: &[(&str, &str, BTreeSet<String>)] = &[
        ("node_cpu_usage_seconds_total", "counter", set(&[])),
        ("node_memory_working_set_bytes", "gauge", set(&[])),
        ("node_swap_usage_bytes", "gauge", set(&[])),
        ("container_cpu_usage_seconds_total", "counter", cpn.clone()),
        ("container_memory_working_set_bytes", "gauge", cpn.clone()),
        ("container_swap_usage_bytes", "gauge", cpn.clone()),
        ("container_start_time_seconds", "gauge", cpn.clone()),
        ("pod_cpu_usage_seconds_total", "counter", pn.clone()),
        ("pod_memory_working_set_bytes", "gauge", pn.clone()),
        ("pod_swap_usage_bytes", "gauge", pn.clone()),
        ("scrape_error", "gauge", set(&[])),
        ("resource_scrape_error", "gauge", set(&[])),
    ];
    for (name, t, labels) in expected {
        assert_eq!(
            ty.get(*name).map(String::as_str),
            Some(*t),
            "TYPE of {name}"
        );
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == *name)
            .unwrap_or_else(|| panic!("no {name} sample in\n{text}"));
        assert_eq!(&label_names(s), labels, "labels of {name}");
    }
    let cpu_line = text
        .lines()
        .find(|l| {
            l.starts_with("container_cpu_usage_seconds_total{")
                && l.contains(&format!("pod=\"{pod_name}\""))
        })
        .expect("our container's cpu line");
    // value and a millisecond timestamp, as upstream's
    // NewLazyMetricWithTimestamp writes.
    let ts: i64 = cpu_line.rsplit(' ').next().unwrap().parse().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now_ms - ts).abs() < 60_000,
        "timestamp {ts} vs now {now_ms}"
    );
    let v = scrape
        .samples
        .iter()
        .find(|s| s.metric == "resource_scrape_error")
        .unwrap();
    assert!(matches!(v.value, prometheus_parse::Value::Gauge(x) if x == 0.0));
}

#[test]
fn an_oom_kill_is_counted_on_the_container_and_its_limit_reported() {
    let k = Kubelet::start("it-stats-oom");
    // `tail` buffers /dev/zero (no newline ever) until the 32 Mi limit
    // kills it; the shell goes on sleeping, so the container keeps its id.
    k.write_manifest(
        "oom.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: oom\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'tail /dev/zero; sleep 3600']\n    resources:\n      limits: {{memory: 32Mi}}\n"
        ),
    );
    let p = k.wait_pod("oom", "Running", T, |p| running(p, "main"));
    let cid = container_status(&p, "main").unwrap()["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let pod_name = format!("oom-{}", k.node);
    // cAdvisor's container_oom_events_total (lib/metrics/prometheus.go,
    // OOMMetrics) on the container's own series.
    let (n, limit) = wait_for("the OOM kill counted", T, || {
        let (_, text) = http_get(&k.read_only, "/metrics/cadvisor")?;
        let scrape = parse(&text);
        let find = |metric: &str| {
            scrape.samples.iter().find(|s| {
                s.metric == metric
                    && s.labels.get("name") == Some(cid.as_str())
                    && s.labels.get("pod") == Some(pod_name.as_str())
            })
        };
        let value = |s: &prometheus_parse::Sample| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
            _ => f64::NAN,
        };
        let n = value(find("container_oom_events_total")?);
        let limit = value(find("container_spec_memory_limit_bytes")?);
        (n >= 1.0).then_some((n, limit))
    });
    assert!(n >= 1.0);
    assert_eq!(limit, 32.0 * 1024.0 * 1024.0);
    let (_, text) = http_get(&k.read_only, "/metrics/cadvisor").unwrap();
    assert_eq!(
        types(&text)
            .get("container_oom_events_total")
            .map(String::as_str),
        Some("counter")
    );

    // The swap limit as cAdvisor reads it from the container's cgroup (v1
    // memory.memsw.limit_in_bytes, memory and swap together; v2
    // memory.swap.max), and what upstream derives from it:
    // container_spec_memory_swap_limit_bytes (0 when unlimited),
    // container_swap_limit_bytes (resource_metrics.go, only under a limit)
    // and the summary's swapAvailableBytes (cadvisorInfoToSwapStats).
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let cg = format!("kubepods/burstable/pod{uid}/{cid}");
    let v1 = Path::new("/sys/fs/cgroup/memory").is_dir();
    let raw = if v1 {
        std::fs::read_to_string(
            PathBuf::from("/sys/fs/cgroup/memory")
                .join(&cg)
                .join("memory.memsw.limit_in_bytes"),
        )
    } else {
        std::fs::read_to_string(
            PathBuf::from("/sys/fs/cgroup")
                .join(&cg)
                .join("memory.swap.max"),
        )
    }
    .map(|t| t.trim().to_string())
    .unwrap_or_else(|_| "0".into());
    let swap_limit: Option<u64> = match raw.as_str() {
        "max" => None,
        t => t.parse().ok().filter(|l| *l <= 1u64 << 62),
    };
    let scrape = parse(&text);
    let spec = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "container_spec_memory_swap_limit_bytes"
                && s.labels.get("name") == Some(cid.as_str())
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) => v,
            _ => f64::NAN,
        });
    assert_eq!(spec, Some(swap_limit.unwrap_or(0) as f64), "{raw}");
    let (_, text) = http_get(&k.read_only, "/metrics/resource").unwrap();
    let resource = parse(&text)
        .samples
        .into_iter()
        .find(|s| {
            s.metric == "container_swap_limit_bytes"
                && s.labels.get("pod") == Some(pod_name.as_str())
                && s.labels.get("container") == Some("main")
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) => v,
            _ => f64::NAN,
        });
    assert_eq!(resource, swap_limit.map(|l| l as f64), "{raw}");
    let (_, body) = http_get(&k.read_only, "/stats/summary").unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    let swap = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["uid"] == uid)
        .and_then(|p| p["containers"].as_array())
        .and_then(|c| c.iter().find(|c| c["name"] == "main"))
        .map(|c| c["swap"].clone())
        .expect("the container in the summary");
    match swap_limit {
        Some(l) => assert_eq!(
            swap["swapAvailableBytes"].as_u64().unwrap() + swap["swapUsageBytes"].as_u64().unwrap(),
            l,
            "{swap}"
        ),
        None => assert!(swap["swapAvailableBytes"].is_null(), "{swap}"),
    }
}
