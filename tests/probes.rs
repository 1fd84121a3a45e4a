//! Probes on real containerd: liveness restarts, readiness drives Ready,
//! and httpGet / tcpSocket / exec handlers against a busybox httpd.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn condition(p: &serde_json::Value, t: &str) -> String {
    p["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

#[test]
fn failing_liveness_probe_restarts_the_container() {
    let k = Kubelet::start("it-liveness");
    k.write_manifest(
        "live.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: live\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'touch /tmp/healthy; sleep 2; rm /tmp/healthy; exec sleep 3600']\n    livenessProbe:\n      exec: {{command: [cat, /tmp/healthy]}}\n      periodSeconds: 1\n      failureThreshold: 2\n"
        ),
    );
    let p = k.wait_pod("live", "restarted by its liveness probe", T, |p| {
        container_status(p, "main").is_some_and(|c| c["restartCount"].as_i64() >= Some(1))
    });
    let c = container_status(&p, "main").unwrap();
    assert_eq!(
        c["lastState"]["terminated"]["exitCode"], 137,
        "killed, not exited on its own"
    );
    assert!(k.log().contains("failed liveness probe"));
}

#[test]
fn readiness_probe_flips_ready_both_ways() {
    let k = Kubelet::start("it-readiness");
    let data = k.dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    k.write_manifest(
        "ready.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ready\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    readinessProbe:\n      exec: {{command: [test, -f, /data/ready]}}\n      periodSeconds: 1\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n  - name: data\n    hostPath: {{path: {}}}\n",
            data.display()
        ),
    );
    let p = k.wait_pod("ready", "running", T, |p| running(p, "main"));
    assert_eq!(
        condition(&p, "Ready"),
        "False",
        "not ready before the probe passes"
    );
    assert_eq!(container_status(&p, "main").unwrap()["ready"], false);
    std::fs::write(data.join("ready"), "").unwrap();
    k.wait_pod("ready", "Ready=True", T, |p| {
        condition(p, "Ready") == "True" && condition(p, "ContainersReady") == "True"
    });
    std::fs::remove_file(data.join("ready")).unwrap();
    let p = k.wait_pod("ready", "Ready=False again", T, |p| {
        condition(p, "Ready") == "False"
    });
    assert_eq!(container_status(&p, "main").unwrap()["restartCount"], 0);
}

#[test]
fn http_tcp_and_exec_probes_pass_against_busybox_httpd() {
    let k = Kubelet::start("it-handlers");
    k.write_manifest(
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: httpd\n    image: {BUSYBOX}\n    command: [sh, -c, 'mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www']\n    ports: [{{name: http, containerPort: 8080}}]\n    startupProbe:\n      exec: {{command: [test, -f, /www/healthz]}}\n      periodSeconds: 1\n    readinessProbe:\n      httpGet: {{path: /healthz, port: http}}\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket: {{port: 8080}}\n      periodSeconds: 1\n"
        ),
    );
    let p = k.wait_pod("web", "Ready", T, |p| condition(p, "Ready") == "True");
    let c = container_status(&p, "httpd").unwrap();
    assert_eq!(c["started"], true);
    assert_eq!(c["ready"], true);
    let metrics = wait_for("all three probe types counted as successful", T, || {
        let (_, body) = http_get(&k.read_only, "/metrics/probes")?;
        let ok = |t: &str| {
            body.lines().any(|l| {
                l.starts_with("prober_probe_total{")
                    && l.contains(&format!("probe_type=\"{t}\""))
                    && l.contains("result=\"successful\"")
                    && l.contains("pod=\"web-it-handlers\"")
            })
        };
        (ok("Startup") && ok("Readiness") && ok("Liveness")).then_some(body)
    });
    // OpenMetrics: the counter family is `prober_probe`, sampled as `_total`.
    assert!(metrics.contains("# TYPE prober_probe_total counter"));
    assert_eq!(
        container_status(&k.pod("web").unwrap(), "httpd").unwrap()["restartCount"],
        0
    );
}
