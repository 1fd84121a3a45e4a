//! The command line behaves like upstream's: --version, unknown flags,
//! unknown and locked feature gates.

use std::process::Command;

/// Runs rkubelet to its exit. Each of these invocations must end at once;
/// one that starts a kubelet instead is killed after a deadline and the
/// test fails, rather than hanging the suite.
fn rkubelet(args: &[&str]) -> std::process::Output {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rkubelet"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "rkubelet {args:?} did not exit within 30 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn version_prints_kubernetes_version() {
    let out = rkubelet(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Kubernetes v1."), "{text}");
}

#[test]
fn unknown_flag_exits_one_with_a_message() {
    let out = rkubelet(&["--no-such-flag=1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown flag: --no-such-flag"));
}

#[test]
fn broken_config_file_exits_one_naming_the_file() {
    let path = std::env::temp_dir().join(format!("rkubelet-badcfg-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: NotAKubeletConfiguration\n",
    )
    .unwrap();
    let out = rkubelet(&["--config", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(path.to_str().unwrap()));
}

#[test]
fn a_bad_eviction_threshold_exits_one_with_upstreams_message() {
    // Old code: evictionHard was accepted unread, whatever it said.
    let out = rkubelet(&["--eviction-hard=memory.free<1Gi"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unsupported eviction signal memory.free"),
        "{err}"
    );
    let out = rkubelet(&[
        "--eviction-soft=memory.available<1Gi",
        "--eviction-hard=memory.available<100Mi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "grace period must be specified for the soft eviction threshold memory.available"
        ),
        "{err}"
    );
}

#[test]
fn an_allowed_unsafe_sysctl_that_is_not_namespaced_exits_one_as_upstream() {
    // Old code: allowedUnsafeSysctls was accepted unread.
    let out = rkubelet(&["--allowed-unsafe-sysctls=kernel.msg*,kernel.panic"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "failed to run Kubelet: the sysctls \"kernel.panic\" are not known to be namespaced"
        ),
        "{err}"
    );
}

#[test]
fn unknown_feature_gate_flag_exits_one_with_upstreams_message() {
    // cmd/kubelet/app/server.go sets the command line's gates before
    // anything else runs.
    let out = rkubelet(&["--feature-gates=NoSuchGate=true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "failed to set feature gates from initial flags-based config: unrecognized feature gate: NoSuchGate"
        ),
        "{err}"
    );
}

#[test]
fn locked_feature_gate_in_the_config_file_exits_one_with_upstreams_message() {
    let path = std::env::temp_dir().join(format!("rkubelet-gates-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         featureGates:\n  NodeSwap: false\n",
    )
    .unwrap();
    let out = rkubelet(&["--config", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "failed to set feature gates from initial flags-based config: \
             cannot set feature gate NodeSwap to false, feature is locked to true"
        ),
        "{err}"
    );
}

#[test]
fn a_bad_config_dir_exits_one_with_upstreams_message() {
    let dir = std::env::temp_dir().join(format!("rkubelet-dropins-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    // A missing directory is an error, as upstream's WalkDir makes it.
    let out = rkubelet(&["--config-dir", &format!("{d}/none")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "failed to merge kubelet configs: failed to walk through kubelet dropin directory \"{d}/none\": lstat {d}/none: no such file or directory"
        )),
        "{err}"
    );
    // A drop-in of another kind.
    std::fs::write(
        dir.join("10-a.conf"),
        "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n",
    )
    .unwrap();
    let out = rkubelet(&["--config-dir", d]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "failed to load kubelet dropin file, path: {d}/10-a.conf, unknown apiVersion/kind: kubelet.config.k8s.io/v1, Kind=KubeletConfiguration"
        )),
        "{err}"
    );
    // A valid drop-in is applied: its bad eviction threshold stops rkubelet.
    std::fs::write(
        dir.join("10-a.conf"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         evictionHard:\n  memory.free: 1Gi\n",
    )
    .unwrap();
    let out = rkubelet(&["--config-dir", d]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unsupported eviction signal memory.free"),
        "{err}"
    );
}

#[test]
fn exit_on_lock_contention_needs_a_lock_file_as_upstream() {
    let out = rkubelet(&["--exit-on-lock-contention"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot exit on lock file contention: no lock file specified"),
        "{err}"
    );
}

#[test]
fn runonce_is_refused_as_upstream() {
    let out = rkubelet(&["--runonce"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Runonce mode has been deprecated and should not be set"),
        "{err}"
    );
}

#[test]
fn logging_format_json_writes_upstreams_json_lines() {
    // Old code: --logging-format was an unknown flag; then `logging.format`
    // was accepted but the logs stayed text. A GA gate's warning is logged
    // once the format is in force, before validation refuses --runonce.
    let out = rkubelet(&[
        "--logging-format=json",
        "--feature-gates=NodeSwap=true",
        "--runonce",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("Setting GA feature gate NodeSwap=true"))
        .unwrap_or_else(|| panic!("no gate warning: {err}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(v["ts"].as_f64().is_some(), "{line}");
    assert!(
        v["caller"].as_str().is_some_and(|c| c.contains(':')),
        "{line}"
    );
    assert_eq!(v["v"], 0, "{line}");
}

#[test]
fn cgroup_v1_and_single_process_oom_kill_are_checked_against_the_host_as_upstream() {
    // Old code: failCgroupV1 and singleProcessOOMKill were accepted unread.
    // Upstream's validateKubeletOSConfiguration looks at the host, so the
    // answer depends on it; --runonce keeps a v2 host from starting a kubelet.
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let out = rkubelet(&["--fail-cgroupv1", "--runonce"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let refused = err.contains(
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is in maintenance mode",
    );
    assert_eq!(refused, !v2, "{err}");

    let dir = std::env::temp_dir().join(format!("rk-cli-oomkill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("config.yaml");
    std::fs::write(
        &conf,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         singleProcessOOMKill: false\nuserNamespaces:\n  idsPerPod: 1000\n",
    )
    .unwrap();
    let out = rkubelet(&["--config", conf.to_str().unwrap(), "--runonce"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let oom = err.contains(
        "invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1",
    );
    assert_eq!(oom, !v2, "{err}");
    // Upstream reports only the first of its host checks.
    let ids =
        err.contains("invalid configuration: userNamespaces.idsPerPod must not be less than 65536");
    assert_eq!(ids, v2, "{err}");
}
