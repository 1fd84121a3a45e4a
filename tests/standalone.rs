//! Standalone mode on real containerd: static pods from a manifest folder
//! run, restart, update, finish and go away as with the upstream kubelet.
//! Needs root and containerd with the CRI plugin (scripts/setup.sh); these
//! tests fail, never skip, when containerd is missing.

mod common;

use std::time::Duration;

use common::*;
use rkubelet::cri::RuntimeService;

const T: Duration = Duration::from_secs(60);

#[test]
fn static_pod_runs_with_a_pod_ip_and_serves_traffic() {
    let k = Kubelet::start("it-serve");
    k.write_manifest(
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {{app: web}}\nspec:\n  containers:\n  - name: httpd\n    image: {BUSYBOX}\n    command: [sh, -c, 'mkdir -p /www && echo served-by-rkubelet > /www/index.html && exec httpd -f -p 8080 -h /www']\n"
        ),
    );
    let p = k.wait_pod("web", "Running with an IP", T, |p| {
        phase(p) == "Running" && p["status"]["podIP"].is_string()
    });
    let ip = p["status"]["podIP"].as_str().unwrap().to_string();
    assert!(ip.starts_with("10.88."), "pod IP from the CNI bridge: {ip}");
    // Upstream static pod identity: name-node, config annotations, node name.
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/config.hash"],
        p["metadata"]["uid"]
    );
    assert_eq!(p["spec"]["nodeName"], "it-serve");
    assert_eq!(p["status"]["qosClass"], "BestEffort");
    let c = container_status(&p, "httpd").unwrap();
    assert!(c["containerID"]
        .as_str()
        .unwrap()
        .starts_with("containerd://"));
    assert_eq!(c["ready"], true);
    let body = wait_for("httpd answers on the pod IP", T, || {
        http_get(&format!("{ip}:8080"), "/")
            .filter(|(s, _)| *s == 200)
            .map(|(_, b)| b)
    });
    assert!(body.contains("served-by-rkubelet"));
    // CRI labels carry upstream's keys.
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let labels = k
        .cri
        .rt
        .block_on(k.cri.client.list_containers(None))
        .unwrap();
    let ours = labels
        .iter()
        .find(|c| c.labels.get("io.kubernetes.pod.uid") == Some(&uid))
        .expect("container with the pod uid label");
    assert_eq!(ours.labels["io.kubernetes.container.name"], "httpd");
    assert_eq!(ours.labels["io.kubernetes.pod.name"], "web-it-serve");
    assert_eq!(ours.labels["io.kubernetes.pod.namespace"], "default");
    assert!(ours
        .annotations
        .contains_key("io.kubernetes.container.hash"));
    assert_eq!(
        ours.annotations["io.kubernetes.container.restartCount"],
        "0"
    );
    // Logs land where upstream puts them.
    let log_dir = format!("/var/log/pods/default_web-it-serve_{uid}/httpd");
    wait_for("container log file", T, || {
        std::path::Path::new(&format!("{log_dir}/0.log"))
            .exists()
            .then_some(())
    });
}

#[test]
fn killed_container_is_restarted_with_restart_count_plus_one() {
    let k = Kubelet::start("it-restart");
    k.write_manifest(
        "sleeper.yaml",
        &simple_pod("sleeper", "exec sleep 3600", "Always"),
    );
    let p = k.wait_pod("sleeper", "running", T, |p| running(p, "main"));
    let first = runtime_id(container_status(&p, "main").unwrap());
    k.cri.kill(&first);
    let p = k.wait_pod("sleeper", "restarted", T, |p| {
        let c = container_status(p, "main").unwrap();
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    });
    let c = container_status(&p, "main").unwrap();
    assert_ne!(
        c["containerID"].as_str().unwrap(),
        format!("containerd://{first}")
    );
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 137);
    assert_eq!(phase(&p), "Running");
}

#[test]
fn edited_manifest_replaces_the_container() {
    let k = Kubelet::start("it-edit");
    // An explicit uid keeps the pod's identity across the edit, so only the
    // changed container is replaced (without one the UID follows the content).
    let manifest = |msg: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: edit\n  uid: 6f1c0d7e-0000-4000-8000-00000000ed17\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'echo {msg}; exec sleep 3600']\n"
        )
    };
    k.write_manifest("edit.yaml", &manifest("one"));
    let p = k.wait_pod("edit", "running", T, |p| running(p, "main"));
    let before = container_status(&p, "main").unwrap()["containerID"].clone();
    k.write_manifest("edit.yaml", &manifest("two"));
    let p = k.wait_pod("edit", "new container running", T, |p| {
        running(p, "main") && container_status(p, "main").unwrap()["containerID"] != before
    });
    assert_eq!(p["metadata"]["uid"], "6f1c0d7e-0000-4000-8000-00000000ed17");
    assert!(p["spec"]["containers"][0]["command"][2]
        .as_str()
        .unwrap()
        .contains("two"));
}

#[test]
fn removed_manifest_removes_sandbox_and_containers() {
    let k = Kubelet::start("it-remove");
    k.write_manifest(
        "gone.yaml",
        &simple_pod("gone", "exec sleep 3600", "Always"),
    );
    let p = k.wait_pod("gone", "running", T, |p| running(p, "main"));
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(k.cri.count_for_uid(&uid), (1, 1));
    // The pod's cgroup, which the runtime made as its sandbox's parent, in
    // every hierarchy (each v1 controller and the unified one).
    let cgroups = rkubelet::cm::podcgroups::PodCgroups::from_mountinfo(
        &std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        "/",
    );
    let dirs = cgroups
        .list(&|_| false)
        .remove(&uid)
        .expect("the pod's cgroups");
    assert!(
        dirs.iter()
            .any(|d| d.ends_with(format!("besteffort/pod{uid}"))),
        "{dirs:?}"
    );
    k.remove_manifest("gone.yaml");
    wait_for("pod gone from /pods", T, || {
        k.pod("gone").is_none().then_some(())
    });
    wait_for("sandbox and containers removed", T, || {
        (k.cri.count_for_uid(&uid) == (0, 0)).then_some(())
    });
    // Removed at housekeeping, as upstream's cleanupOrphanedPodCgroups does.
    wait_for("the pod's cgroups removed", T, || {
        dirs.iter().all(|d| !d.exists()).then_some(())
    });
}

#[test]
fn restart_policies_never_and_on_failure_end_failed_and_succeeded() {
    let k = Kubelet::start("it-policy");
    k.write_manifest("fails.yaml", &simple_pod("fails", "exit 3", "Never"));
    k.write_manifest("works.yaml", &simple_pod("works", "exit 0", "OnFailure"));
    let f = k.wait_pod("fails", "Failed", T, |p| phase(p) == "Failed");
    let c = container_status(&f, "main").unwrap();
    assert_eq!(c["state"]["terminated"]["exitCode"], 3);
    assert_eq!(c["state"]["terminated"]["reason"], "Error");
    assert_eq!(c["restartCount"], 0);
    let w = k.wait_pod("works", "Succeeded", T, |p| phase(p) == "Succeeded");
    let c = container_status(&w, "main").unwrap();
    assert_eq!(c["state"]["terminated"]["reason"], "Completed");
    let ready = w["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "PodCompleted");
}

#[test]
fn init_containers_finish_before_app_containers_start() {
    let k = Kubelet::start("it-init");
    k.write_manifest(
        "init.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: init\nspec:\n  terminationGracePeriodSeconds: 2\n  initContainers:\n  - name: first\n    image: {BUSYBOX}\n    command: [sh, -c, 'sleep 1; echo from-first > /shared/a']\n    volumeMounts: [{{name: shared, mountPath: /shared}}]\n  - name: second\n    image: {BUSYBOX}\n    command: [sh, -c, 'test -f /shared/a && cat /shared/a > /shared/b']\n    volumeMounts: [{{name: shared, mountPath: /shared}}]\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sh, -c, 'test -f /shared/b && exec sleep 3600; exit 1']\n    volumeMounts: [{{name: shared, mountPath: /shared, readOnly: true}}]\n  volumes:\n  - name: shared\n    emptyDir: {{}}\n"
        ),
    );
    let p = k.wait_pod("init", "app running", T, |p| running(p, "app"));
    for name in ["first", "second"] {
        let s = init_status(&p, name).unwrap();
        assert_eq!(s["state"]["terminated"]["reason"], "Completed", "{name}");
    }
    let app = container_status(&p, "app").unwrap();
    assert_eq!(
        app["restartCount"], 0,
        "the app found the files the init containers wrote"
    );
    let init_cond = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Initialized")
        .unwrap()
        .clone();
    assert_eq!(init_cond["status"], "True");
}

#[test]
fn restarted_rkubelet_adopts_running_pods_with_the_same_container_ids() {
    let mut k = Kubelet::start("it-adopt");
    k.write_manifest(
        "keep.yaml",
        &simple_pod("keep", "exec sleep 3600", "Always"),
    );
    let p = k.wait_pod("keep", "running", T, |p| running(p, "main"));
    let id = container_status(&p, "main").unwrap()["containerID"].clone();
    let uid = p["metadata"]["uid"].clone();
    k.stop();
    k.spawn();
    let p = k.wait_pod("keep", "running after restart", T, |p| running(p, "main"));
    assert_eq!(p["metadata"]["uid"], uid);
    let c = container_status(&p, "main").unwrap();
    assert_eq!(c["containerID"], id);
    assert_eq!(c["restartCount"], 0);
    let uid = uid.as_str().unwrap();
    assert_eq!(
        k.cri.count_for_uid(uid),
        (1, 1),
        "no second sandbox or container"
    );
}

#[test]
fn garbage_manifest_is_skipped_and_other_pods_keep_running() {
    let mut k = Kubelet::start("it-garbage");
    k.write_manifest(
        "good.yaml",
        &simple_pod("good", "exec sleep 3600", "Always"),
    );
    let p = k.wait_pod("good", "running", T, |p| running(p, "main"));
    let id = container_status(&p, "main").unwrap()["containerID"].clone();
    k.write_manifest(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [this is not\n  a pod\n",
    );
    k.write_manifest(
        "worse.json",
        "{\"kind\": \"Pod\", \"apiVersion\": \"v1\", \"spec\": 42}",
    );
    wait_for("the broken manifest is logged with its path", T, || {
        k.log().contains("bad.yaml").then_some(())
    });
    assert!(k.is_running());
    let p = k.pod("good").expect("good pod still listed");
    assert_eq!(container_status(&p, "main").unwrap()["containerID"], id);
    assert_eq!(k.pods().len(), 1);
    // A pod added after the garbage still starts.
    k.write_manifest(
        "later.yaml",
        &simple_pod("later", "exec sleep 3600", "Always"),
    );
    k.wait_pod("later", "running", T, |p| running(p, "main"));
}

#[test]
fn log_directories_and_links_of_pods_that_are_gone_are_removed() {
    // Old code: nothing removed a pod's directory under /var/log/pods nor
    // a dead link in /var/log/containers; every pod ever run left them.
    let stale = std::path::PathBuf::from(format!(
        "/var/log/pods/default_gone-it-podlogs_{}",
        "0f0e0d0c-0b0a-4909-8807-060504030201"
    ));
    std::fs::create_dir_all(stale.join("main")).unwrap();
    std::fs::write(stale.join("main/0.log"), "old\n").unwrap();
    let link = std::path::PathBuf::from(format!(
        "/var/log/containers/gone-it-podlogs_default_main-{}.log",
        "ab".repeat(32)
    ));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(stale.join("main/1.log"), &link).unwrap();

    let k = Kubelet::start("it-podlogs");
    k.write_manifest(
        "keep.yaml",
        &simple_pod("keep", "exec sleep 3600", "Always"),
    );
    let p = k.wait_pod("keep", "running", T, |p| running(p, "main"));
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let kept = std::path::PathBuf::from(format!("/var/log/pods/default_keep-it-podlogs_{uid}"));
    wait_for("the gone pod's log directory removed", T, || {
        (!stale.exists()).then_some(())
    });
    wait_for("the dead link removed", T, || {
        link.symlink_metadata().is_err().then_some(())
    });
    assert!(kept.join("main").exists(), "a running pod's logs stay");
}

/// Runs `iptables ARGS` (quietly); whether it exited 0.
fn iptables(args: &str) -> bool {
    std::process::Command::new("iptables")
        .args(["-w", "5"])
        .args(args.split_whitespace())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Upstream's container manager sets the kernel's panic, overcommit and
/// keyring settings at start, or with `protectKernelDefaults` refuses to
/// start when they differ; its kubelet makes the KUBE-IPTABLES-HINT and
/// KUBE-FIREWALL chains (`makeIPTablesUtilChains`, on by default) that
/// kube-proxy's image looks for. Old code did neither: the settings stayed
/// as they were and no chain was made.
#[test]
fn kernel_settings_and_iptables_chains_are_made_as_upstream_at_start() {
    let mut k = Kubelet::new("it-node-setup");
    // What a fresh Debian host has (kernel.panic 0 or 1), and no chains.
    let panic = std::path::Path::new("/proc/sys/kernel/panic");
    std::fs::write(panic, "1").unwrap();
    for from in ["INPUT", "OUTPUT"] {
        while iptables(&format!("-t filter -D {from} -j KUBE-FIREWALL")) {}
    }
    for (table, chain) in [
        ("filter", "KUBE-FIREWALL"),
        ("mangle", "KUBE-IPTABLES-HINT"),
        ("mangle", "KUBE-KUBELET-CANARY"),
        ("nat", "KUBE-KUBELET-CANARY"),
        ("filter", "KUBE-KUBELET-CANARY"),
    ] {
        iptables(&format!("-t {table} -F {chain}"));
        iptables(&format!("-t {table} -X {chain}"));
        assert!(
            !iptables(&format!("-t {table} -S {chain}")),
            "{table} {chain} left"
        );
    }

    k.extra_config = "protectKernelDefaults: true\n".into();
    k.launch();
    wait_for("rkubelet to refuse to start", T, || {
        (!k.is_running()).then_some(())
    });
    let log = k.log();
    assert!(
        log.contains("failed to start ContainerManager")
            && log
                .contains("invalid kernel flag: kernel/panic, expected value: 10, actual value: 1"),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(panic).unwrap().trim(), "1");

    k.extra_config = String::new();
    k.spawn();
    for (name, want) in [
        ("vm/overcommit_memory", "1"),
        ("vm/panic_on_oom", "0"),
        ("kernel/panic", "10"),
        ("kernel/panic_on_oops", "1"),
        ("kernel/keys/root_maxkeys", "1000000"),
        ("kernel/keys/root_maxbytes", "25000000"),
    ] {
        let have = std::fs::read_to_string(format!("/proc/sys/{name}")).unwrap();
        assert_eq!(have.trim(), want, "{name}");
    }
    wait_for("the kubelet's iptables chains", T, || {
        (iptables("-t mangle -S KUBE-IPTABLES-HINT")
            && iptables("-t filter -C INPUT -j KUBE-FIREWALL")
            && iptables("-t filter -C OUTPUT -j KUBE-FIREWALL")
            && ["mangle", "nat", "filter"]
                .iter()
                .all(|t| iptables(&format!("-t {t} -S KUBE-KUBELET-CANARY"))))
        .then_some(())
    });
    let rules = std::process::Command::new("iptables")
        .args(["-w", "5", "-t", "filter", "-S", "KUBE-FIREWALL"])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    let drop: Vec<&str> = rules.lines().filter(|l| l.contains("-j DROP")).collect();
    assert_eq!(drop.len(), 1, "{rules}");
    assert!(
        drop[0].contains("-d 127.0.0.0/8")
            && drop[0].contains("! -s 127.0.0.0/8")
            && drop[0].contains("block incoming localnet connections")
            && drop[0].contains("! --ctstate RELATED,ESTABLISHED,DNAT"),
        "{rules}"
    );
}

/// The cgroup path of `pid` in the hierarchy holding `controller` (v1) or
/// the unified one (v2), from /proc/<pid>/cgroup.
fn cgroup_of(pid: u32, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matched = if controller.is_empty() {
            l.starts_with("0::")
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matched.then(|| path.to_string())
    })
}

/// Upstream's container manager keeps the kubelet's own process in
/// `kubeletCgroups` (made if missing, in every hierarchy), checked at start
/// and every minute. Old code: the field was accepted unread and rkubelet
/// stayed where it was started.
#[test]
fn the_kubelet_runs_in_its_kubelet_cgroups_as_upstream() {
    let name = format!("rkubelet-it-kubelet-{}", std::process::id());
    let mut k = Kubelet::new("it-kubelet-cgroup");
    k.extra_config = format!("cgroupRoot: /\nkubeletCgroups: /{name}\n");
    k.spawn();
    let pid = k.pid().unwrap();
    let want = format!("/{name}");
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let controllers: &[&str] = if v2 {
        &[""]
    } else {
        &["cpu", "memory", "pids", "devices"]
    };
    wait_for("rkubelet in its kubelet cgroup", T, || {
        controllers
            .iter()
            .all(|c| cgroup_of(pid, c).as_deref() == Some(want.as_str()))
            .then_some(())
    });
    k.stop();
    // The emptied cgroup goes, in each hierarchy it was made in.
    let roots: Vec<std::path::PathBuf> = if v2 {
        vec!["/sys/fs/cgroup".into()]
    } else {
        std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    };
    for root in roots {
        let dir = root.join(&name);
        if dir.exists() {
            std::fs::remove_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
    }
}

/// A swap file switched on for a test, off again when dropped.
struct SwapFile(std::path::PathBuf);

impl SwapFile {
    fn on(path: std::path::PathBuf) -> Self {
        let run = |cmd: &str, args: &[&str]| {
            let s = std::process::Command::new(cmd).args(args).status().unwrap();
            assert!(s.success(), "{cmd} {args:?}");
        };
        let p = path.to_str().unwrap();
        run(
            "dd",
            &[
                "if=/dev/zero",
                &format!("of={p}"),
                "bs=1M",
                "count=16",
                "status=none",
            ],
        );
        run("chmod", &["600", p]);
        run("mkswap", &["-q", p]);
        run("swapon", &[p]);
        SwapFile(path)
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Upstream's NewContainerManager refuses a node with swap on unless
/// `failSwapOn` is off (on by default). Old code: the field was accepted
/// unread and rkubelet started whatever swap was doing.
#[test]
fn with_swap_on_rkubelet_starts_only_when_fail_swap_on_is_off() {
    let mut k = Kubelet::new("it-swap");
    let _swap = SwapFile::on(k.dir.join("swapfile"));
    k.extra_args = vec!["--fail-swap-on=true".into()];
    k.launch();
    wait_for("rkubelet to refuse to start", T, || {
        (!k.is_running()).then_some(())
    });
    let log = k.log();
    assert!(
        log.contains("running with swap on is not supported, please disable swap or set --fail-swap-on flag to false"),
        "{log}"
    );
    // The test config says failSwapOn: false.
    k.extra_args.clear();
    k.spawn();
    assert!(k.is_running());
}
