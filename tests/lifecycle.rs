//! Pod lifecycle on real containerd: hooks, sidecars, termination
//! messages, downward-API env, host networking and image pull policies.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn read_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn pre_stop_runs_before_the_container_is_signalled() {
    let k = Kubelet::start("it-prestop");
    let out = k.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    k.write_manifest(
        "hooks.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hooks\nspec:\n  terminationGracePeriodSeconds: 10\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'trap \"echo term >> /out/log; exit 0\" TERM; echo start >> /out/log; while true; do sleep 0.2; done']\n    lifecycle:\n      preStop:\n        exec:\n          command: [sh, -c, 'echo prestop >> /out/log']\n    volumeMounts: [{{name: out, mountPath: /out}}]\n  volumes:\n  - name: out\n    hostPath: {{path: {}}}\n",
            out.display()
        ),
    );
    k.wait_pod("hooks", "running", T, |p| running(p, "main"));
    wait_for("container wrote start", T, || {
        (read_lines(&out.join("log")) == ["start"]).then_some(())
    });
    k.remove_manifest("hooks.yaml");
    let lines = wait_for("container terminated", T, || {
        let l = read_lines(&out.join("log"));
        (l.len() >= 3).then_some(l)
    });
    assert_eq!(lines, ["start", "prestop", "term"]);
}

#[test]
fn sidecar_runs_beside_the_app_and_stops_after_it() {
    let k = Kubelet::start("it-sidecar");
    let out = k.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let trap = |who: &str| {
        format!(
            "'trap \"echo {who}-term >> /out/log; exit 0\" TERM; while true; do sleep 0.2; done'"
        )
    };
    k.write_manifest(
        "side.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: side\nspec:\n  terminationGracePeriodSeconds: 10\n  initContainers:\n  - name: proxy\n    image: {BUSYBOX}\n    restartPolicy: Always\n    command: [sh, -c, {}]\n    volumeMounts: [{{name: out, mountPath: /out}}]\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sh, -c, {}]\n    volumeMounts: [{{name: out, mountPath: /out}}]\n  volumes:\n  - name: out\n    hostPath: {{path: {}}}\n",
            trap("proxy"),
            trap("app"),
            out.display()
        ),
    );
    let p = k.wait_pod("side", "app and sidecar running", T, |p| {
        running(p, "app")
            && init_status(p, "proxy").is_some_and(|s| s["state"]["running"].is_object())
    });
    assert_eq!(phase(&p), "Running");
    let init = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Initialized")
        .unwrap()
        .clone();
    assert_eq!(init["status"], "True");
    k.remove_manifest("side.yaml");
    let lines = wait_for("both stopped", T, || {
        let l = read_lines(&out.join("log"));
        (l.len() >= 2).then_some(l)
    });
    assert_eq!(
        lines,
        ["app-term", "proxy-term"],
        "the sidecar stops after the app"
    );
}

#[test]
fn termination_message_comes_from_the_file_or_the_logs() {
    let k = Kubelet::start("it-termmsg");
    k.write_manifest(
        "file.yaml",
        &simple_pod(
            "file",
            "printf bye-from-file > /dev/termination-log; exit 3",
            "Never",
        ),
    );
    k.write_manifest(
        "logs.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: logs\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [sh, -c, 'echo first; echo oops-from-logs; exit 2']\n"
        ),
    );
    let p = k.wait_pod("file", "Failed", T, |p| phase(p) == "Failed");
    let t = &container_status(&p, "main").unwrap()["state"]["terminated"];
    assert_eq!(t["message"], "bye-from-file");
    assert_eq!(t["exitCode"], 3);
    let p = k.wait_pod("logs", "Failed", T, |p| phase(p) == "Failed");
    let msg = container_status(&p, "main").unwrap()["state"]["terminated"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("oops-from-logs"), "{msg:?}");
}

#[test]
fn downward_api_env_and_expansion_are_visible_inside_the_container() {
    let k = Kubelet::start("it-env");
    k.write_manifest(
        "env.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: env\n  namespace: team-a\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    env:\n    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}\n    - {{name: POD_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}\n    - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}\n    - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}\n    - {{name: GREETING, value: 'hi $(POD_NAME)'}}\n    command: [sh, -c, 'echo \"$POD_NAME|$POD_NS|$NODE|$POD_IP|$GREETING|$(NODE)\" > /dev/termination-log']\n"
        ),
    );
    let p = k.wait_pod("env", "Succeeded", T, |p| phase(p) == "Succeeded");
    let msg = container_status(&p, "main").unwrap()["state"]["terminated"]["message"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    let ip = p["status"]["podIP"].as_str().unwrap();
    assert_eq!(
        msg,
        format!("env-it-env|team-a|it-env|{ip}|hi env-it-env|it-env")
    );
}

#[test]
fn host_network_pod_sees_the_hosts_interfaces() {
    let k = Kubelet::start("it-hostnet");
    k.write_manifest(
        "hostnet.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hostnet\nspec:\n  hostNetwork: true\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'cut -d: -f1 /proc/net/dev | tr -d \" \" | tail -n +3 | tr \"\\n\" \" \" > /dev/termination-log']\n"
        ),
    );
    let p = k.wait_pod("hostnet", "Succeeded", T, |p| phase(p) == "Succeeded");
    let seen = container_status(&p, "main").unwrap()["state"]["terminated"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    let host = std::fs::read_to_string("/proc/net/dev").unwrap();
    let host_ifaces: Vec<&str> = host
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    let mut seen_ifaces: Vec<&str> = seen.split_whitespace().collect();
    let mut expected = host_ifaces.clone();
    seen_ifaces.sort();
    expected.sort();
    // Interfaces may come and go (other pods' veths), so compare the stable ones.
    for iface in expected.iter().filter(|i| !i.starts_with("veth")) {
        assert!(
            seen_ifaces.contains(iface),
            "host interface {iface} missing in the pod: {seen_ifaces:?}"
        );
    }
}

#[test]
fn missing_image_with_never_policy_reports_err_image_never_pull() {
    let k = Kubelet::start("it-neverpull");
    k.write_manifest(
        "never.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: never\nspec:\n  containers:\n  - name: main\n    image: docker.io/library/not-here:1.0\n    imagePullPolicy: Never\n",
    );
    let p = k.wait_pod("never", "ErrImageNeverPull", T, |p| {
        container_status(p, "main")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "ErrImageNeverPull")
    });
    assert_eq!(phase(&p), "Pending");
    let msg = container_status(&p, "main").unwrap()["state"]["waiting"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("not present with pull policy of Never"),
        "{msg}"
    );
}

#[test]
fn failing_post_start_hook_kills_the_container() {
    let k = Kubelet::start("it-poststart");
    k.write_manifest(
        "post.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: post\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    lifecycle:\n      postStart:\n        exec:\n          command: [sh, -c, 'exit 1']\n"
        ),
    );
    let p = k.wait_pod("post", "killed after its postStart hook failed", T, |p| {
        container_status(p, "main").is_some_and(|c| {
            c["restartCount"].as_i64() >= Some(1) || c["lastState"]["terminated"].is_object()
        })
    });
    assert!(
        !running(&p, "main")
            || container_status(&p, "main").unwrap()["restartCount"].as_i64() >= Some(1)
    );
    assert!(k.log().contains("FailedPostStartHook"));
}

#[test]
fn active_deadline_fails_the_pod_with_deadline_exceeded() {
    let k = Kubelet::start("it-deadline");
    k.write_manifest(
        "deadline.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: deadline\nspec:\n  activeDeadlineSeconds: 3\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
        ),
    );
    k.wait_pod("deadline", "running", T, |p| running(p, "main"));
    let p = k.wait_pod("deadline", "Failed", T, |p| phase(p) == "Failed");
    assert_eq!(p["status"]["reason"], "DeadlineExceeded");
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    wait_for("container stopped", T, || {
        let p = k.pod("deadline")?;
        (!running(&p, "main")).then_some(())
    });
    // Not restarted: the only container instance is the first one.
    assert_eq!(k.cri.count_for_uid(&uid).1, 1);
}

#[test]
fn kubelet_managed_hosts_file_and_fqdn_hostname() {
    let k = Kubelet::start("it-hosts");
    k.write_manifest(
        "hosts.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hosts\nspec:\n  restartPolicy: Never\n  hostname: web-0\n  hostAliases:\n  - ip: 10.1.2.3\n    hostnames: [foo.local, bar.local]\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'cat /etc/hosts > /dev/termination-log; echo \"hostname=$(hostname)\" >> /dev/termination-log']\n"
        ),
    );
    let p = k.wait_pod("hosts", "Succeeded", T, |p| phase(p) == "Succeeded");
    let msg = container_status(&p, "main").unwrap()["state"]["terminated"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    let ip = p["status"]["podIP"].as_str().unwrap();
    assert!(msg.starts_with("# Kubernetes-managed hosts file."), "{msg}");
    assert!(msg.contains(&format!("{ip}\tweb-0\n")), "{msg}");
    assert!(msg.contains("10.1.2.3\tfoo.local\tbar.local"), "{msg}");
    assert!(msg.contains("hostname=web-0"), "{msg}");
    assert_eq!(
        container_status(&p, "main").unwrap()["image"],
        "docker.io/library/busybox:1.36"
    );
}

#[test]
fn run_as_non_root_with_a_root_image_is_a_config_error() {
    let k = Kubelet::start("it-nonroot");
    k.write_manifest(
        "nonroot.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nonroot\nspec:\n  securityContext:\n    runAsNonRoot: true\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n  - name: allowed\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    securityContext:\n      runAsUser: 65534\n"
        ),
    );
    let p = k.wait_pod("nonroot", "CreateContainerConfigError", T, |p| {
        container_status(p, "main")
            .is_some_and(|c| c["state"]["waiting"]["reason"] == "CreateContainerConfigError")
            && running(p, "allowed")
    });
    let msg = container_status(&p, "main").unwrap()["state"]["waiting"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("image will run as root"), "{msg}");
}
