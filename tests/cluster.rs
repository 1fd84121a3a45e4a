//! Cluster mode against the in-process double of the API server (see
//! `common::apiserver`: a double, not a real kube-apiserver), with rkubelet
//! on the machine's real containerd: the Node is registered with upstream's
//! fields and kept Ready, its Lease is renewed, a pod bound to the node runs
//! and its status reaches the API, a graceful deletion ends with the pod
//! object deleted, and a static pod gets a mirror pod that is recreated
//! after deletion and removed with its manifest.

mod common;

use std::time::Duration;

use common::apiserver::{ApiServer, ApiServerOptions, KubeconfigUser};
use common::*;
use rkubelet::cri::{ImageService, RuntimeService};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(90);

/// A kubeconfig with a client certificate for `system:node:<node>`, as a
/// bootstrapped kubelet has.
fn kubeconfig(api: &ApiServer, dir: &std::path::Path, node: &str) -> std::path::PathBuf {
    api.node_kubeconfig(dir, node)
}

fn cond<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// A pod bound to `node` with one busybox container `main` running `script`.
fn bound_pod(name: &str, node: &str, grace: i64, script: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script]
            }]
        }
    })
}

/// containerLogs of a default-namespace pod's container on :10250
/// (anonymous, as `cluster_kubelet` allows), with the HTTP code appended
/// after a newline.
fn container_logs(k: &Kubelet, pod: &str, container_and_query: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"])
        .arg(format!(
            "https://{}/containerLogs/default/{pod}/{container_and_query}",
            k.api
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Waits for the default-namespace pod's first container to be ready in
/// the API, and returns the pod.
fn ready_pod(api: &ApiServer, name: &str, what: &str) -> Value {
    wait_for(what, T, || {
        api.get("pods", Some("default"), name)
            .filter(|p| p["status"]["containerStatuses"][0]["ready"] == true)
    })
}

fn cluster_kubelet(node: &str, api: &ApiServer) -> Kubelet {
    cluster_kubelet_with(node, api, "")
}

/// `cluster_kubelet` with `extra` appended to its KubeletConfiguration.
fn cluster_kubelet_with(node: &str, api: &ApiServer, extra: &str) -> Kubelet {
    let mut k = Kubelet::new(node);
    let kc = kubeconfig(api, &k.dir, node);
    k.extra_args = vec![
        "--kubeconfig".into(),
        kc.display().to_string(),
        format!("--cert-dir={}", k.dir.join("pki").display()),
    ];
    k.extra_config = format!(
        "nodeStatusUpdateFrequency: 1s\nnodeLeaseDurationSeconds: 4\nsyncFrequency: 5s\n{extra}"
    );
    k.spawn();
    k
}

#[test]
fn the_node_registers_renews_its_lease_and_runs_a_bound_pod() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-cluster";
    let k = cluster_kubelet(node, &api);

    // Registration with upstream's labels, addresses, capacity and info.
    let n = wait_for("the Node to be registered and Ready", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "Ready").is_some_and(|c| c["status"] == "True"))
    });
    let labels = &n["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], node);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(labels["kubernetes.io/arch"].is_string());
    let s = &n["status"];
    assert_eq!(s["capacity"]["pods"], "110");
    assert!(s["allocatable"]["memory"].is_string());
    assert!(s["nodeInfo"]["containerRuntimeVersion"]
        .as_str()
        .unwrap()
        .starts_with("containerd://"));
    assert_eq!(s["nodeInfo"]["kubeletVersion"], "v1.34.0");
    // The API spells it "Port" (DaemonEndpoint json:"Port").
    // The port the kubelet serves its API on (the tests' free port).
    let port: u64 = k.api.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(s["daemonEndpoints"]["kubeletEndpoint"]["Port"], port);
    let ready = cond(&n, "Ready").unwrap();
    assert_eq!(ready["reason"], "KubeletReady");
    assert_eq!(ready["message"], "kubelet is posting ready status");
    let addrs = s["addresses"].as_array().unwrap();
    assert!(addrs.iter().any(|a| a["type"] == "InternalIP"));
    assert!(addrs
        .iter()
        .any(|a| a["type"] == "Hostname" && a["address"] == node));

    // The default serving certificate: self-signed, for the node's name.
    let crt = k.dir.join("pki").join("kubelet.crt");
    let pem = wait_for("kubelet.crt", T, || std::fs::read_to_string(&crt).ok());
    assert_eq!(
        pem.matches("BEGIN CERTIFICATE").count(),
        2,
        "cert and its CA"
    );
    assert!(k.dir.join("pki").join("kubelet.key").exists());

    // The Lease: held by the node, owned by it, renewed (4 s → every 1 s).
    let lease = wait_for("the node lease", T, || {
        api.get("leases", Some("kube-node-lease"), node)
    });
    assert_eq!(lease["spec"]["holderIdentity"], node);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 4);
    let first = lease["spec"]["renewTime"].clone();
    wait_for("the lease to be renewed", T, || {
        api.get("leases", Some("kube-node-lease"), node)
            .filter(|l| l["spec"]["renewTime"] != first)
            .filter(|l| l["metadata"]["ownerReferences"][0]["kind"] == "Node")
    });

    // A pod bound to the node runs; its status reaches the API.
    let name = format!("web-{node}");
    api.create(bound_pod(
        &name,
        node,
        30,
        "trap 'exit 0' TERM; while true; do sleep 1; done",
    ));
    let p = wait_for("the pod's Running status in the API", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["ready"] == true
        })
    });
    let st = &p["status"];
    assert!(st["podIP"].is_string(), "{st:#}");
    assert!(st["hostIP"].is_string(), "{st:#}");
    assert_eq!(st["qosClass"], "BestEffort");
    assert!(cond(&p, "Ready").is_some_and(|c| c["status"] == "True"));
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(k.cri.count_for_uid(&uid).1, 1);
    // The startup SLI: measured once the watch showed the pod started.
    let sli = wait_for("the pod startup SLI on /metrics", T, || {
        let (_, text) = http_get(&k.read_only, "/metrics")?;
        let count = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        let n = count("kubelet_pod_start_sli_duration_seconds_count ")?;
        (n >= 1.0).then(|| {
            (
                count("kubelet_pod_start_sli_duration_seconds_sum ").unwrap(),
                count("kubelet_pod_start_total_duration_seconds_count ").unwrap(),
            )
        })
    });
    assert!(sli.0 > 0.0 && sli.1 >= 1.0, "{sli:?}");
    assert!(k.log().contains("observed pod startup duration"));

    // A killed container is restarted; its restartCount reaches the API.
    k.cri.kill(&runtime_id(&st["containerStatuses"][0]));
    wait_for("restartCount 1 in the API", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["containerStatuses"][0]["restartCount"] == 1
                && p["status"]["containerStatuses"][0]["ready"] == true
        })
    });

    // Graceful deletion with grace 5: the pod is stopped, its last status
    // sent, then it is deleted (grace 0, by the kubelet).
    let mut watch = api
        .client()
        .with_timeout(T)
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=true&fieldSelector=metadata.name%3D{name}&resourceVersion={}",
            api.resource_version()
        ))
        .unwrap();
    api.delete("pods", Some("default"), &name, Some(5));
    assert!(
        api.get("pods", Some("default"), &name)
            .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "a bound pod is deleted gracefully"
    );
    let mut last = None;
    loop {
        let ev = watch.next_event().unwrap().expect("the watch ended early");
        if ev["type"] == "DELETED" {
            break;
        }
        if ev["type"] == "MODIFIED" {
            last = Some(ev["object"].clone());
        }
    }
    // Upstream: a deleted pod's last status is terminal (its container
    // exited 0 on SIGTERM: Succeeded), sent before the object goes.
    let last = last.expect("a status update before the delete");
    assert_eq!(last["status"]["phase"], "Succeeded", "{last:#}");
    assert!(last["status"]["containerStatuses"][0]["state"]["terminated"].is_object());
    assert_eq!(
        k.cri.count_labelled("io.kubernetes.pod.uid", &uid, true),
        (0, 0),
        "nothing of the pod runs"
    );
}

#[test]
fn a_static_pod_gets_a_mirror_pod_that_follows_it() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-mirror";
    let k = cluster_kubelet(node, &api);
    k.write_manifest(
        "static.yaml",
        &simple_pod("static", "exec sleep 3600", "Always"),
    );
    let name = format!("static-{node}");
    let mirror = wait_for("the mirror pod", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["status"]["phase"] == "Running")
    });
    let ann = &mirror["metadata"]["annotations"];
    assert!(ann["kubernetes.io/config.mirror"].is_string(), "{mirror:#}");
    assert_eq!(mirror["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(mirror["spec"]["nodeName"], node);
    let first_uid = mirror["metadata"]["uid"].clone();

    // Deleted by someone: recreated.
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the mirror pod to be recreated", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["metadata"]["uid"] != first_uid)
    });
    // The static pod itself was never restarted.
    let p = k.pod("static").expect("static pod listed");
    assert_eq!(container_status(&p, "main").unwrap()["restartCount"], 0);

    // Manifest removed: the mirror pod goes.
    k.remove_manifest("static.yaml");
    wait_for("the mirror pod to be removed", T, || {
        api.get("pods", Some("default"), &name)
            .is_none()
            .then_some(())
    });
}

#[test]
fn tls_bootstrap_gets_a_client_certificate_through_a_csr() {
    let token = "abcdef.0123456789abcdef".to_string();
    let api = ApiServer::start(ApiServerOptions {
        require_client_cert: true,
        bootstrap_tokens: vec![token.clone()],
        ..Default::default()
    });
    let node = "it-bootstrap";
    let mut k = Kubelet::new(node);
    k.extra_config =
        "nodeLeaseDurationSeconds: 4\nrotateCertificates: true\nserverTLSBootstrap: true\n".into();
    let boot = k.dir.join("bootstrap-kubelet.conf");
    api.write_kubeconfig(&boot, KubeconfigUser::Token(token));
    let kubeconfig = k.dir.join("kubelet.conf");
    let cert_dir = k.dir.join("pki");
    k.extra_args = vec![
        format!("--bootstrap-kubeconfig={}", boot.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cert-dir={}", cert_dir.display()),
    ];
    k.spawn();

    // The CSR as upstream sends it; the test approves it.
    let csr = wait_for("the kubelet's CSR", T, || {
        api.list("certificatesigningrequests").into_iter().next()
    });
    let spec = &csr["spec"];
    assert_eq!(
        spec["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(spec["usages"], json!(["digital signature", "client auth"]));
    assert_eq!(spec["username"], "system:bootstrap:abcdef");
    // A short-lived certificate, so that rotation (70-90 % into its life)
    // happens within the test; renewals are approved automatically.
    api.set_issued_cert_lifetime(Duration::from_secs(40));
    api.set_csr_auto_approve(true);
    api.approve_csr(csr["metadata"]["name"].as_str().unwrap());

    // The certificate lands behind the current symlink, the kubeconfig
    // uses it, and the node registers as system:node:<node>.
    let current = cert_dir.join("kubelet-client-current.pem");
    wait_for("kubelet-client-current.pem", T, || {
        std::fs::read_to_string(&current)
            .ok()
            .filter(|s| s.contains("BEGIN CERTIFICATE") && s.contains("PRIVATE KEY"))
    });
    let target = std::fs::read_link(&current).unwrap();
    assert!(target
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("kubelet-client-2"));
    let kc = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(kc.contains("kubelet-client-current.pem"), "{kc}");
    wait_for("the Node registered with the issued certificate", T, || {
        api.get("nodes", None, node)
    });
    let user = format!("system:node:{node}");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.user == user && r.path.starts_with("/api/v1/nodes")),
        "the node was registered with the bootstrapped identity"
    );

    // serverTLSBootstrap: a serving CSR for the node's addresses.
    let serving = wait_for("the serving CSR", T, || {
        api.list("certificatesigningrequests")
            .into_iter()
            .find(|c| c["spec"]["signerName"] == "kubernetes.io/kubelet-serving")
    });
    assert_eq!(
        serving["spec"]["usages"],
        json!(["digital signature", "server auth"])
    );
    assert_eq!(serving["spec"]["username"], user.as_str());
    wait_for("kubelet-server-current.pem", T, || {
        std::fs::read_to_string(cert_dir.join("kubelet-server-current.pem"))
            .ok()
            .filter(|s| s.contains("BEGIN CERTIFICATE"))
    });

    // Rotation: a second CSR sent as the node itself, a new pair behind
    // the symlink, and the kubelet carries on past the first one's expiry
    // without a restart.
    let issued_at = std::time::Instant::now();
    wait_for("the renewal CSR from the node", T, || {
        api.list("certificatesigningrequests")
            .into_iter()
            .find(|c| {
                c["spec"]["username"] == user.as_str()
                    && c["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
            })
    });
    wait_for("the rotated pair behind the symlink", T, || {
        std::fs::read_link(&current).ok().filter(|t| *t != target)
    });
    let expired = Duration::from_secs(45).saturating_sub(issued_at.elapsed());
    std::thread::sleep(expired); // past the first certificate's lifetime
    let before =
        api.get("leases", Some("kube-node-lease"), node).unwrap()["spec"]["renewTime"].clone();
    wait_for("the lease renewed with the rotated certificate", T, || {
        api.get("leases", Some("kube-node-lease"), node)
            .filter(|l| l["spec"]["renewTime"] != before)
    });
    assert!(k.is_running(), "rkubelet was not restarted");

    // The issued serving certificate is what :10250 serves; it is renewed
    // through a second serving CSR before it expires, and the renewed one
    // is served without a restart.
    let on_disk = || {
        std::fs::read_to_string(cert_dir.join("kubelet-server-current.pem"))
            .ok()
            .and_then(|pem| first_cert(&pem))
    };
    let first = wait_for("the issued serving certificate on :10250", T, || {
        served_cert(&k.api).filter(|c| Some(c) == on_disk().as_ref())
    });
    wait_for("a renewed serving certificate on :10250", T, || {
        served_cert(&k.api).filter(|c| *c != first && Some(c) == on_disk().as_ref())
    });
    let serving_csrs = api
        .list("certificatesigningrequests")
        .into_iter()
        .filter(|c| c["spec"]["signerName"] == "kubernetes.io/kubelet-serving")
        .count();
    assert!(serving_csrs >= 2, "{serving_csrs} serving CSRs");
    assert!(k.is_running(), "rkubelet was not restarted");

    // The certificate managers' /metrics families (kubelet.go,
    // cmd/kubelet/app/server.go): both TTLs from the certificates in use
    // (issued for 40 s), the renewal-error counters without _total, and
    // the serving rotation observed once a certificate was replaced.
    let sample = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let text = wait_for("the serving rotation observed", T, || {
        let (_, text) = http_get(&k.read_only, "/metrics")?;
        let n = sample(
            &text,
            "kubelet_certificate_manager_server_rotation_seconds_count",
        )?;
        (n >= 1.0).then_some(text)
    });
    for name in [
        "kubelet_certificate_manager_client_ttl_seconds",
        "kubelet_certificate_manager_server_ttl_seconds",
    ] {
        let ttl = sample(&text, name).unwrap_or_else(|| panic!("no {name}: {text}"));
        assert!(ttl.is_finite() && ttl <= 40.0, "{name} {ttl}");
    }
    for name in [
        "kubelet_certificate_manager_client_expiration_renew_errors",
        "kubelet_server_expiration_renew_errors",
    ] {
        assert!(sample(&text, name).is_some(), "no {name}: {text}");
    }
}

/// The first certificate of a PEM text, as its base64 body.
fn first_cert(pem: &str) -> Option<String> {
    let start = pem.find("-----BEGIN CERTIFICATE-----")? + 27;
    let end = start + pem[start..].find("-----END CERTIFICATE-----")?;
    Some(pem[start..end].split_whitespace().collect())
}

/// The certificate a TLS server at `addr` presents (openssl as the client).
fn served_cert(addr: &str) -> Option<String> {
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-connect", addr])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    first_cert(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn an_api_outage_and_a_410_relist_touch_no_running_pod() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-outage";
    let k = cluster_kubelet(node, &api);
    wait_for("the Node", T, || api.get("nodes", None, node));
    let name = format!("keep-{node}");
    api.create(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"]}],
            "nodeSelector": {"kubernetes.io/os": "linux"}
        }
    }));
    let running = |p: &Value| {
        p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["ready"] == true
    };
    let p = wait_for("the pod Running in the API", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| running(p))
    });
    let (_, body) = http_get(&k.healthz, "/healthz?verbose").unwrap();
    assert!(body.contains("[+]apiserver ok"), "{body}");
    let cid = p["status"]["containerStatuses"][0]["containerID"].clone();

    // Events with upstream's reasons reached the API.
    wait_for("Pulled, Created and Started events", T, || {
        let reasons: Vec<String> = api
            .list("events")
            .iter()
            .filter(|e| e["involvedObject"]["name"] == name.as_str())
            .filter(|e| e["source"]["component"] == "kubelet")
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect();
        ["Pulled", "Created", "Started"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r))
            .then_some(())
    });

    // The API server goes away; its history is compacted meanwhile, so the
    // watch comes back to a 410 and must re-list.
    api.stop();
    let outage = std::time::Instant::now();
    // /healthz stays ok and names the unreachable API server.
    let (code, body) = wait_for("healthz to show the API server unreachable", T, || {
        http_get(&k.healthz, "/healthz?verbose")
            .filter(|(_, b)| b.contains("[+]apiserver unreachable"))
    });
    assert_eq!(code, 200, "{body}");
    // A static pod added while the API server is away: its status is
    // computed now and must reach the API (through its mirror pod) once
    // the server is back.
    let static_name = format!("during-{node}");
    k.write_manifest(
        "during.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: during\nspec:\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'exec sleep 3600']\n"
        ),
    );
    wait_for(
        "the static pod running locally during the outage",
        T,
        || k.pod("during").filter(|p| running(p)),
    );
    // The outage lasts two minutes, as the issue asks (a duration, not a
    // synchronisation): longer than the lease and several status periods.
    std::thread::sleep(Duration::from_secs(120).saturating_sub(outage.elapsed()));
    api.compact();
    let lease_before =
        api.get("leases", Some("kube-node-lease"), node).unwrap()["spec"]["renewTime"].clone();
    api.restart();
    // Nothing was killed, the lease is renewed again and the pod is listed anew.
    wait_for("the lease renewed after the outage", T, || {
        api.get("leases", Some("kube-node-lease"), node)
            .filter(|l| l["spec"]["renewTime"] != lease_before)
    });
    // The status computed during the outage is sent within one status
    // period (upstream's status manager syncs every 10 s) of the return.
    let back = std::time::Instant::now();
    wait_for(
        "the static pod's status in the API after the outage",
        T,
        || {
            api.get("pods", Some("default"), &static_name)
                .filter(|p| running(p))
        },
    );
    assert!(
        back.elapsed() <= Duration::from_secs(15),
        "the status took {:?} after the API server came back",
        back.elapsed()
    );
    let after = |p: &Value| p["status"]["containerStatuses"][0]["containerID"] == cid;
    // A second pod created after the outage starts: the watch re-listed.
    let second = format!("after-{node}");
    api.create(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": second, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", "exec sleep 3600"]}]}
    }));
    wait_for("the pod created after the outage to run", T, || {
        api.get("pods", Some("default"), &second)
            .filter(|p| running(p))
    });
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert!(
        running(&p) && after(&p),
        "the first pod kept its container: {p:#}"
    );
    assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0);
    drop(k);
}

#[test]
fn a_pod_that_does_not_fit_is_rejected_with_upstreams_reason() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-admit";
    let _k = cluster_kubelet(node, &api);
    wait_for("the Node", T, || api.get("nodes", None, node));
    let name = format!("picky-{node}");
    api.create(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "nodeSelector": {"disk": "ssd"},
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["true"]}]}
    }));
    let p = wait_for("the rejection in the API", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(p["status"]["reason"], "NodeAffinity");
    assert_eq!(
        p["status"]["message"],
        "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
    );

    // supplementalGroupsPolicy: Strict needs a runtime that says it
    // applies it (CRI Status features; containerd 1.7 reports none), as
    // the Node's status.features shows. Old code: the policy was dropped
    // and the pod ran as Merge.
    let strict = format!("strict-{node}");
    let mut pod = bound_pod(&strict, node, 1, "id -G; sleep 3600");
    pod["spec"]["securityContext"] =
        json!({"supplementalGroups": [4000], "supplementalGroupsPolicy": "Strict"});
    api.create(pod);
    let n = wait_for("the Node's status", T, || {
        api.get("nodes", None, node)
            .filter(|n| n["status"]["nodeInfo"]["containerRuntimeVersion"] != "")
    });
    if n["status"]["features"]["supplementalGroupsPolicy"] == true {
        let p = wait_for("the pod running", T, || {
            api.get("pods", Some("default"), &strict)
                .filter(|p| p["status"]["phase"] == "Running")
        });
        assert_eq!(
            p["status"]["containerStatuses"][0]["user"]["linux"]["supplementalGroups"],
            json!([0, 4000]),
            "{:#}",
            p["status"]
        );
    } else {
        assert!(n["status"]["features"].is_null(), "{:#}", n["status"]);
        let p = wait_for("the Strict pod refused", T, || {
            api.get("pods", Some("default"), &strict)
                .filter(|p| p["status"]["phase"] == "Failed")
        });
        assert_eq!(
            p["status"]["reason"],
            "SupplementalGroupsPolicyNotSupported"
        );
        assert_eq!(
            p["status"]["message"],
            "Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node"
        );
    }
}

#[test]
fn with_register_node_false_only_an_existing_node_is_kept_up_to_date() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-noreg";
    let mut k = Kubelet::new(node);
    let kc = kubeconfig(&api, &k.dir, node);
    k.extra_args = vec![
        format!("--kubeconfig={}", kc.display()),
        format!("--cert-dir={}", k.dir.join("pki").display()),
    ];
    k.extra_config =
        "registerNode: false\nnodeStatusUpdateFrequency: 1s\nnodeLeaseDurationSeconds: 4\n".into();
    k.spawn();
    // The lease proves rkubelet talks to the API; no Node is created.
    wait_for("the node lease", T, || {
        api.get("leases", Some("kube-node-lease"), node)
    });
    assert!(
        api.get("nodes", None, node).is_none(),
        "registerNode: false creates no Node"
    );
    // Someone else creates it: rkubelet keeps its status.
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}));
    wait_for("the existing Node's Ready condition", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "Ready").is_some_and(|c| c["status"] == "True"))
    });
}

/// Upstream's tryUpdateNodeStatus works on the Node the API server has: a
/// condition another component owns (a CNI's NetworkUnavailable) survives
/// the kubelet's updates, and a Ready the node lifecycle controller turned
/// Unknown is set back at the next period because it differs from the
/// API's (not after nodeStatusReportFrequency, set to an hour here).
#[test]
fn status_updates_keep_conditions_others_set_and_answer_the_apis_state() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-foreign";
    let mut k = Kubelet::new(node);
    let kc = kubeconfig(&api, &k.dir, node);
    k.extra_args = vec![
        format!("--kubeconfig={}", kc.display()),
        format!("--cert-dir={}", k.dir.join("pki").display()),
    ];
    k.extra_config = "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 1h\nnodeLeaseDurationSeconds: 4\n".into();
    k.spawn();
    wait_for("the Node Ready", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "Ready").is_some_and(|c| c["status"] == "True"))
    });
    // The kubelet watches its own Node, and only that one.
    wait_for("the watch of the kubelet's Node", T, || {
        (api.count_requests("GET", "fieldSelector=metadata.name%3Dit-foreign") > 0).then_some(())
    });

    let status_patch = |body: Value| {
        let r = api
            .client()
            .patch(
                &format!("/api/v1/nodes/{node}/status"),
                "application/strategic-merge-patch+json",
                &body,
            )
            .unwrap();
        assert_eq!(r.status, 200, "{:#}", r.body);
    };
    let network = json!({"type": "NetworkUnavailable", "status": "False",
        "reason": "RouteCreated", "message": "route created by the test's CNI",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    status_patch(json!({"status": {"conditions": [network.clone()]}}));
    status_patch(
        json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
        "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    );

    let n = wait_for("the kubelet to set Ready back", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "Ready").is_some_and(|c| c["status"] == "True"))
    });
    let ready = cond(&n, "Ready").unwrap();
    assert_eq!(ready["reason"], "KubeletReady");
    assert_ne!(
        ready["lastTransitionTime"], "2026-01-01T00:00:00Z",
        "a transition from the API's Unknown"
    );
    assert_eq!(cond(&n, "NetworkUnavailable"), Some(&network), "{n:#}");
    assert!(cond(&n, "MemoryPressure").is_some_and(|c| c["status"] == "False"));

    // Someone drops the os label and changes the arch one: the next status
    // update puts both back, and keeps the label the test added.
    let r = api
        .client()
        .patch(
            &format!("/api/v1/nodes/{node}"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"kubernetes.io/os": null,
                "kubernetes.io/arch": "by-hand", "team": "a"}}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    let n = wait_for("the os and arch labels back", T, || {
        api.get("nodes", None, node)
            .filter(|n| n["metadata"]["labels"]["kubernetes.io/os"] == "linux")
            .filter(|n| n["metadata"]["labels"]["kubernetes.io/arch"] != "by-hand")
    });
    assert_eq!(n["metadata"]["labels"]["team"], "a");
    assert_eq!(
        n["metadata"]["labels"]["kubernetes.io/arch"],
        n["metadata"]["labels"]["beta.kubernetes.io/arch"]
    );

    // The controller manager allocates pod CIDRs: the kubelet hands them to
    // the runtime (CRI UpdateRuntimeConfig), once.
    let r = api
        .client()
        .patch(
            &format!("/api/v1/nodes/{node}"),
            "application/merge-patch+json",
            &json!({"spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    wait_for("the pod CIDR given to the runtime", T, || {
        k.log()
            .contains("updating pod CIDR original_pod_cidr= new_pod_cidr=10.244.7.0/24")
            .then_some(())
    });
}

/// A node that starts NotReady (here: the runtime's socket appears only
/// after the kubelet started) is reported Ready as soon as it would be,
/// not a status period later (upstream's fastStatusUpdateOnce). The status
/// period is an hour here, so the old code left it NotReady.
#[test]
fn a_node_that_starts_not_ready_is_reported_ready_at_once() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-fast";
    let mut k = Kubelet::new(node);
    let kc = kubeconfig(&api, &k.dir, node);
    let sock = k.dir.join("late-cri.sock");
    k.extra_args = vec![
        format!("--kubeconfig={}", kc.display()),
        format!("--cert-dir={}", k.dir.join("pki").display()),
        format!("--container-runtime-endpoint=unix://{}", sock.display()),
    ];
    k.extra_config = "nodeStatusUpdateFrequency: 1h
nodeStatusReportFrequency: 1h
nodeLeaseDurationSeconds: 40
"
    .into();
    k.launch();
    let n = wait_for("the Node registered NotReady", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "Ready").is_some_and(|c| c["status"] == "False"))
    });
    assert_eq!(
        cond(&n, "Ready").unwrap()["reason"],
        "KubeletNotReady",
        "{n:#}"
    );
    std::os::unix::fs::symlink(ENDPOINT.trim_start_matches("unix://"), &sock).unwrap();
    let n = wait_for("the Node Ready", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "Ready").is_some_and(|c| c["status"] == "True"))
    });
    assert_eq!(cond(&n, "Ready").unwrap()["reason"], "KubeletReady");
    assert!(
        k.log()
            .contains("fast updating node status as it just became ready"),
        "{}",
        k.log()
    );
}

/// The kubelet's copy of an API pod follows the pod's status in the API
/// (upstream HandlePodReconcile), and a deleted pod stays known until the
/// API removes it (HandlePodRemoves). So a readiness gate met by its
/// controller makes the pod Ready, and a pod in its grace period is still
/// on /pods and has logs, as `kubectl logs` during a slow shutdown needs.
/// The old code ignored status-only changes (Ready stayed False for good)
/// and forgot a pod as its deletion began (/pods lost it, logs were a 404).
#[test]
fn a_met_readiness_gate_readies_the_pod_and_a_terminating_pod_keeps_its_logs() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-gates";
    let k = cluster_kubelet(node, &api);
    let name = format!("gated-{node}");
    // Deaf to SIGTERM: the grace period runs its course.
    let mut pod = bound_pod(
        &name,
        node,
        120,
        "trap '' TERM; while true; do echo tick; sleep 1; done",
    );
    pod["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}]);
    api.create(pod);
    let p = wait_for("the container ready, the gate not met", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["containerStatuses"][0]["ready"] == true
                && cond(p, "Ready").is_some_and(|c| c["status"] == "False")
        })
    });
    let ready = cond(&p, "Ready").unwrap();
    assert_eq!(ready["reason"], "ReadinessGatesNotReady", "{p:#}");
    assert_eq!(
        ready["message"],
        "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
    );

    // The gate's controller (a load balancer's, say) sets its condition.
    let gate = json!({"type": "example.com/lb", "status": "True",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let r = api
        .client()
        .patch(
            &format!("/api/v1/namespaces/default/pods/{name}/status"),
            "application/strategic-merge-patch+json",
            &json!({"status": {"conditions": [gate.clone()]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    let p = wait_for("Ready once the gate is met", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| cond(p, "Ready").is_some_and(|c| c["status"] == "True"))
    });
    assert_eq!(
        cond(&p, "example.com/lb"),
        Some(&gate),
        "left as its owner set it"
    );

    // /pods shows the pod as the API has it, the gate's condition with it.
    let listed = |pred: &dyn Fn(&Value) -> bool| -> Option<Value> {
        let (200, body) = http_get(&k.read_only, "/pods")? else {
            return None;
        };
        let v: Value = serde_json::from_str(&body).ok()?;
        v["items"]
            .as_array()?
            .iter()
            .find(|p| p["metadata"]["name"] == name.as_str())
            .filter(|p| pred(p))
            .cloned()
    };
    wait_for("the gate's condition on /pods", T, || {
        listed(&|p| cond(p, "example.com/lb").is_some())
    });

    // A graceful deletion: the pod stays listed, with its deletionTimestamp,
    // and its logs stay readable while it terminates.
    api.delete("pods", Some("default"), &name, Some(120));
    wait_for("/pods to show the deletion", T, || {
        listed(&|p| p["metadata"]["deletionTimestamp"].is_string())
    });
    let out = container_logs(&k, &name, "main?tailLines=2");
    assert!(out.ends_with("\n200"), "{out}");
    assert!(out.starts_with("tick\n"), "{out}");
    assert!(
        k.cri
            .count_labelled("io.kubernetes.pod.name", &name, true)
            .0
            > 0,
        "still running in its grace period"
    );

    // Forced now (grace 0): the API removes the object, and so does /pods.
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the pod gone from /pods", T, || {
        let (200, body) = http_get(&k.read_only, "/pods")? else {
            return None;
        };
        (!body.contains(name.as_str())).then_some(())
    });
}

/// `kubectl debug`: an ephemeral container added through the pod's
/// ephemeralcontainers subresource (a strategic-merge patch, as kubectl
/// sends) is started in the running pod, in its target's process namespace
/// (CRI NamespaceMode TARGET), reported in ephemeralContainerStatuses,
/// readable through containerLogs, and never restarted. The old code never
/// started it: kubectl waited for good.
#[test]
fn an_ephemeral_container_runs_once_beside_its_target() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-debug";
    let k = cluster_kubelet(node, &api);
    let name = format!("debugged-{node}");
    api.create(bound_pod(
        &name,
        node,
        1,
        "echo main-marker; while true; do sleep 1; done",
    ));
    ready_pod(&api, &name, "the pod running");
    let r = api
        .client()
        .patch(
            &format!("/api/v1/namespaces/default/pods/{name}/ephemeralcontainers"),
            "application/strategic-merge-patch+json",
            &json!({"spec": {"ephemeralContainers": [{
                "name": "debugger",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "targetContainerName": "main",
                "command": ["sh", "-c", "ps -o pid,args; exit 3"],
                "terminationMessagePolicy": "File"
            }]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    let p = wait_for("the debugger's status in the API", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["ephemeralContainerStatuses"][0]["state"]["terminated"].is_object()
        })
    });
    let eph = &p["status"]["ephemeralContainerStatuses"][0];
    assert_eq!(eph["name"], "debugger", "{p:#}");
    assert_eq!(eph["state"]["terminated"]["exitCode"], 3, "{eph:#}");
    assert_eq!(eph["ready"], false);
    assert_eq!(eph["restartCount"], 0);
    assert!(eph["containerID"]
        .as_str()
        .is_some_and(|id| id.starts_with("containerd://")));
    assert_eq!(
        p["status"]["phase"], "Running",
        "a debugger weighs on nothing"
    );
    // PodObservedGenerationTracking (on in 1.34): the debugger was a new
    // spec generation, which the kubelet reports having observed.
    assert_eq!(p["metadata"]["generation"], 2);
    assert_eq!(p["status"]["observedGeneration"], 2, "{:#}", p["status"]);
    assert_eq!(cond(&p, "Ready").unwrap()["observedGeneration"], 2);

    // It saw the target's processes: its `ps` lists main's shell.
    let out = container_logs(&k, &name, "debugger");
    assert!(out.contains("echo main-marker"), "{out}");

    // A restart of main syncs the pod again: the debugger stays as it
    // ended, never started a second time.
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    k.cri
        .kill(&runtime_id(&p["status"]["containerStatuses"][0]));
    let p = wait_for("main restarted", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["containerStatuses"][0]["restartCount"] == 1
                && p["status"]["containerStatuses"][0]["ready"] == true
        })
    });
    let eph = &p["status"]["ephemeralContainerStatuses"][0];
    assert_eq!(eph["restartCount"], 0, "{eph:#}");
    assert_eq!(eph["state"]["terminated"]["exitCode"], 3);
    assert_eq!(
        k.cri.count_for_uid(&uid).1,
        3,
        "main twice and the debugger once"
    );

    // kubectl itself, as a user runs it: `kubectl debug` reads the pod and
    // patches the subresource; the kubelet runs its container beside the
    // first, and main is left alone.
    let config = k.dir.join("kubectl-admin.conf");
    let (cert, key) =
        api.issue_client_cert("admin", &["system:masters"], Duration::from_secs(3600));
    let (cert_path, key_path) = (k.dir.join("admin.crt"), k.dir.join("admin.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    api.write_kubeconfig(
        &config,
        KubeconfigUser::ClientCert {
            cert: cert_path,
            key: key_path,
        },
    );
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&config)
        .args([
            "debug",
            &name,
            "--namespace",
            "default",
            "--container",
            "kdebug",
        ])
        .args(["--image", BUSYBOX, "--image-pull-policy", "IfNotPresent"])
        .args([
            "--target",
            "main",
            "--",
            "sh",
            "-c",
            "echo from-kubectl-debug",
        ])
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl debug: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = wait_for("kubectl's debugger ran", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["ephemeralContainerStatuses"]
                .as_array()
                .is_some_and(|s| {
                    s.iter()
                        .any(|c| c["name"] == "kdebug" && c["state"]["terminated"]["exitCode"] == 0)
                })
        })
    });
    assert_eq!(
        p["status"]["ephemeralContainerStatuses"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        p["status"]["containerStatuses"][0]["restartCount"], 1,
        "main untouched"
    );
    let out = container_logs(&k, &name, "kdebug");
    assert!(out.contains("from-kubectl-debug"), "{out}");
}

/// In-place resize (InPlacePodVerticalScaling, beta and on in 1.34) through
/// the `pods/{name}/resize` subresource, as `kubectl patch --subresource
/// resize` sends it: a resize that fits is applied to the running
/// container without a restart; one past the node's capacity waits as
/// Infeasible and leaves the container alone; reverting it clears the
/// condition in the API. Old code: the container kept its old limits and
/// no condition said anything.
#[test]
fn a_resize_is_applied_in_place_or_waits_as_upstream() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-resize";
    let k = cluster_kubelet(node, &api);
    let name = format!("resized-{node}");
    // The container prints its cgroup's cpu quota, memory limit and swap
    // limit (v1 or v2 files) every half second.
    let mut pod = bound_pod(
        &name,
        node,
        1,
        "while true; do \
           q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max); \
           m=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max); \
           s=$(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.swap.max); \
           echo \"quota=$q memory=$m swap=$s\"; sleep 0.5; done",
    );
    // Upstream's NoSwap (the default): on v1 memory+swap capped at the
    // memory limit, on v2 no swap. Old code left swap unlimited.
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let swap = |limit: &str| {
        if v2 {
            "0".to_string()
        } else {
            limit.to_string()
        }
    };
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "memory": "32Mi"},
        "limits": {"cpu": "200m", "memory": "64Mi"}
    });
    api.create(pod);
    let p = ready_pod(&api, &name, "the pod running");
    assert!(
        cond(&p, "PodResizeInProgress").is_none(),
        "{:#}",
        p["status"]
    );
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["resources"]["limits"]["cpu"], "200m", "{cs:#}");
    assert_eq!(cs["resources"]["limits"]["memory"], "64Mi", "{cs:#}");
    assert_eq!(cs["allocatedResources"]["cpu"], "100m", "{cs:#}");
    let id = cs["containerID"].clone();
    wait_for("the old quota in the container", T, || {
        container_logs(&k, &name, "main")
            .contains(&format!(
                "quota=20000 memory=67108864 swap={}",
                swap("67108864")
            ))
            .then_some(())
    });

    let resize = |cpu_request: &str, cpu_limit: &str| {
        let r = api
            .client()
            .patch(
                &format!("/api/v1/namespaces/default/pods/{name}/resize"),
                "application/strategic-merge-patch+json",
                &json!({"spec": {"containers": [{
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": cpu_request},
                        "limits": {"cpu": cpu_limit, "memory": "96Mi"}
                    }
                }]}}),
            )
            .unwrap();
        assert_eq!(r.status, 200, "{:#}", r.body);
    };

    // Fits: applied in place, same container, no restart.
    resize("200m", "400m");
    let p = wait_for("the resize applied", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            p["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] == "400m"
                && cond(p, "PodResizeInProgress").is_none()
        })
    });
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["containerID"], id, "resized in place, not restarted");
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(cs["resources"]["limits"]["memory"], "96Mi", "{cs:#}");
    assert_eq!(cs["allocatedResources"]["cpu"], "200m", "{cs:#}");
    assert!(cond(&p, "PodResizePending").is_none(), "{:#}", p["status"]);
    assert_eq!(p["status"]["observedGeneration"], 2);
    wait_for("the new quota in the container", T, || {
        container_logs(&k, &name, "main")
            .contains(&format!(
                "quota=40000 memory=100663296 swap={}",
                swap("100663296")
            ))
            .then_some(())
    });
    // The pod's own cgroup follows (old code left it without limits; a
    // pod cgroup left at the old quota refuses the container's on v1).
    let pod_dir = format!(
        "kubepods/burstable/pod{}",
        p["metadata"]["uid"].as_str().unwrap()
    );
    assert_eq!(pod_cpu_quota(&pod_dir), "40000");
    assert_eq!(
        host_cgroup("memory", &pod_dir, "memory.limit_in_bytes", "memory.max"),
        "100663296"
    );
    wait_for("the ResizeCompleted event", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "ResizeCompleted" && e["involvedObject"]["name"] == name.as_str()
        })
    });

    // Past the node's capacity: Infeasible, and nothing changes.
    resize("1000", "1000");
    let p = wait_for("Infeasible", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| cond(p, "PodResizePending").is_some_and(|c| c["reason"] == "Infeasible"))
    });
    let c = cond(&p, "PodResizePending").unwrap();
    assert_eq!(c["status"], "True");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .starts_with("Node didn't have enough capacity: cpu, requested: 1000000, capacity: "),
        "{c:#}"
    );
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["resources"]["limits"]["cpu"], "400m", "{cs:#}");
    assert_eq!(cs["allocatedResources"]["cpu"], "200m", "{cs:#}");
    assert_eq!(cs["containerID"], id);

    // Reverted: the condition leaves the API's status.
    resize("200m", "400m");
    wait_for("PodResizePending cleared", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| cond(p, "PodResizePending").is_none())
    });
    let logs = container_logs(&k, &name, "main");
    let last = logs.lines().rfind(|l| l.starts_with("quota="));
    assert!(
        last.is_some_and(|l| l.starts_with("quota=40000 ")),
        "{logs}"
    );
    // A pod without resources (BestEffort): what containerd reports for it
    // (no quota, minimal shares) is what its spec gives, so it never looks
    // resized.
    let plain = format!("plain-{node}");
    api.create(bound_pod(&plain, node, 1, "while true; do sleep 1; done"));
    let p = ready_pod(&api, &plain, "the plain pod running");
    assert!(
        cond(&p, "PodResizeInProgress").is_none(),
        "{:#}",
        p["status"]
    );
    assert_eq!(p["status"]["containerStatuses"][0]["resources"], json!({}));

    // A memory limit below what the container uses is refused, as
    // upstream's validateMemoryResizeAction (cgroup v2 would OOM-kill it):
    // the container fills 40 MiB of page cache, charged to its cgroup.
    let squeezed = format!("squeezed-{node}");
    let mut pod = bound_pod(
        &squeezed,
        node,
        1,
        "dd if=/dev/zero of=/fill bs=1M count=40 2>/dev/null; sync; echo filled; \
         while true; do \
           m=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max); \
           echo \"memory=$m\"; sleep 0.5; done",
    );
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"memory": "8Mi"},
        "limits": {"memory": "64Mi"}
    });
    api.create(pod);
    wait_for("the page cache filled", T, || {
        container_logs(&k, &squeezed, "main")
            .contains("memory=67108864")
            .then_some(())
    });
    let limit = |memory: &str| {
        let r = api
            .client()
            .patch(
                &format!("/api/v1/namespaces/default/pods/{squeezed}/resize"),
                "application/strategic-merge-patch+json",
                &json!({"spec": {"containers": [{
                    "name": "main",
                    "resources": {"limits": {"memory": memory}}
                }]}}),
            )
            .unwrap();
        assert_eq!(r.status, 200, "{:#}", r.body);
    };
    limit("16Mi");
    let p = wait_for("the decrease refused", T, || {
        api.get("pods", Some("default"), &squeezed)
            .filter(|p| cond(p, "PodResizeInProgress").is_some_and(|c| c["reason"] == "Error"))
    });
    let c = cond(&p, "PodResizeInProgress").unwrap();
    assert!(
        c["message"].as_str().unwrap().starts_with(
            "cannot decrease memory limits: attempting to set container \"main\" \
             memory limit (16777216) below current usage ("
        ),
        "{c:#}"
    );
    let logs = container_logs(&k, &squeezed, "main");
    let last = logs.lines().rfind(|l| l.starts_with("memory="));
    assert_eq!(last, Some("memory=67108864"), "{logs}");
    // Above what it uses: applied.
    limit("56Mi");
    wait_for("the decrease applied", T, || {
        container_logs(&k, &squeezed, "main")
            .contains("memory=58720256")
            .then_some(())
    });
    wait_for("the resize done", T, || {
        api.get("pods", Some("default"), &squeezed)
            .filter(|p| cond(p, "PodResizeInProgress").is_none())
    });

    // Two updates reached the runtime: the resizes that fit. The settings
    // containerd reports for an untouched container never look resized.
    assert_eq!(
        k.log().matches("resizing container in place").count(),
        2,
        "{}",
        k.log()
    );
}

/// A pod sized only by pod-level resources (PodLevelResources, beta and on
/// in 1.34). The API server records its QoS class at creation and refuses
/// a status write with another (status.qosClass is immutable). Old code:
/// rkubelet computed BestEffort from the containers, its every status
/// patch was refused, and the pod never showed Running; its cgroup sat
/// under besteffort, and the downward API showed the node's capacity for
/// its limits.
#[test]
fn a_pod_sized_at_pod_level_keeps_its_qos_class_and_limits() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-podlevel";
    let k = cluster_kubelet(node, &api);
    let name = format!("sized-{node}");
    let mut pod = bound_pod(
        &name,
        node,
        1,
        "echo \"cpu=$CPU_LIMIT memory=$MEMORY_LIMIT\"; grep memory /proc/self/cgroup; \
         while true; do sleep 1; done",
    );
    pod["spec"]["resources"] = json!({"limits": {"cpu": "500m", "memory": "64Mi"}});
    let field = |var: &str, resource: &str, divisor: &str| {
        json!({"name": var, "valueFrom": {"resourceFieldRef": {
            "containerName": "main", "resource": resource, "divisor": divisor
        }}})
    };
    pod["spec"]["containers"][0]["env"] = json!([
        field("CPU_LIMIT", "limits.cpu", "1m"),
        field("MEMORY_LIMIT", "limits.memory", "1Mi"),
    ]);
    let created = api.create(pod);
    assert_eq!(created["status"]["qosClass"], "Guaranteed");
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let p = wait_for("the pod running in the API", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["status"]["phase"] == "Running")
    });
    assert_eq!(p["status"]["qosClass"], "Guaranteed");
    let logs = wait_for("the container's report", T, || {
        let l = container_logs(&k, &name, "main");
        l.contains(":memory:").then_some(l)
    });
    assert!(logs.contains("cpu=500 memory=64"), "{logs}");
    // Guaranteed pods sit directly under kubepods (v1: memory's
    // hierarchy; v2: the unified one).
    let cgroup = logs
        .lines()
        .find(|l| l.contains(":memory:") || l.starts_with("0::"));
    assert!(
        cgroup.is_some_and(|l| l.contains(&format!("kubepods/pod{uid}"))),
        "{logs}"
    );
    assert!(
        !k.log().contains("field is immutable"),
        "a status patch was refused: {}",
        k.log()
    );
}

/// Upstream's pod and node events for what goes wrong under a pod (old
/// code sent none of them): a pod asking for its own user namespace on a
/// runtime without them is refused its sandbox (FailedCreatePodSandBox;
/// old code ran it in the node's user namespace), a sandbox that dies is
/// replaced (SandboxChanged), and a cgroup v1 host says it is one
/// (CgroupV1).
#[test]
fn sandbox_and_node_troubles_are_reported_as_upstreams_events() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-sandbox-events";
    let k = cluster_kubelet(node, &api);
    let event = |reason: &'static str, name: String| {
        let api = &api;
        move || {
            api.list("events")
                .into_iter()
                .find(|e| e["reason"] == reason && e["involvedObject"]["name"] == name.as_str())
        }
    };

    let own = format!("userns-{node}");
    let mut pod = bound_pod(&own, node, 1, "sleep 3600");
    pod["spec"]["hostUsers"] = json!(false);
    let created = api.create(pod);
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let e = wait_for(
        "FailedCreatePodSandBox",
        T,
        event("FailedCreatePodSandBox", own.clone()),
    );
    assert_eq!(e["type"], "Warning");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("Failed to create pod sandbox: can't set `spec.hostUsers: false`"),
        "{e:#}"
    );
    let cri = Cri::new();
    assert_eq!(cri.count_for_uid(&uid), (0, 0), "no sandbox, no container");

    // A running pod whose sandbox is stopped under it gets a new one.
    let name = format!("sandboxed-{node}");
    let created = api.create(bound_pod(&name, node, 1, "sleep 3600"));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    ready_pod(&api, &name, "the pod running");
    cri.stop_sandboxes_of(&uid);
    let e = wait_for("SandboxChanged", T, event("SandboxChanged", name.clone()));
    assert_eq!(e["type"], "Normal");
    assert_eq!(
        e["message"],
        "Pod sandbox changed, it will be killed and re-created."
    );
    wait_for("a new sandbox", T, || {
        (cri.count_labelled("io.kubernetes.pod.uid", &uid, true).0 == 1).then_some(())
    });

    let v1 = !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let node_event = api
        .list("events")
        .into_iter()
        .find(|e| e["reason"] == "CgroupV1" && e["involvedObject"]["kind"] == "Node");
    if v1 {
        let e = node_event.expect("a CgroupV1 event on a cgroup v1 host");
        assert_eq!(e["type"], "Warning");
        assert_eq!(
            e["message"],
            "cgroup v1 support is in maintenance mode, please migrate to cgroup v2"
        );
        assert_eq!(e["involvedObject"]["name"], node);
    } else {
        assert!(node_event.is_none(), "{node_event:?}");
    }
    drop(k);
}

#[test]
fn under_memory_pressure_pods_are_refused_and_evicted_as_upstream() {
    // Old code: evictionHard was accepted and ignored; the Node never
    // showed MemoryPressure and no pod was refused or evicted. Then an
    // evicted pod's containers and logs stayed as long as the pod did.
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-evict";
    // More than any machine has: the threshold is met from the first round.
    let k = cluster_kubelet_with(node, &api, "evictionHard:\n  memory.available: 1Pi\n");
    let n = wait_for("MemoryPressure on the Node", T, || {
        api.get("nodes", None, node)
            .filter(|n| cond(n, "MemoryPressure").is_some_and(|c| c["status"] == "True"))
    });
    let c = cond(&n, "MemoryPressure").unwrap();
    assert_eq!(c["reason"], "KubeletHasInsufficientMemory");
    assert_eq!(c["message"], "kubelet has insufficient memory available");
    assert_eq!(cond(&n, "DiskPressure").unwrap()["status"], "False");

    // A BestEffort pod is refused at admission.
    let refused = format!("besteffort-{node}");
    api.create(bound_pod(&refused, node, 1, "sleep 3600"));
    let p = wait_for("the BestEffort pod refused", T, || {
        api.get("pods", Some("default"), &refused)
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(p["status"]["reason"], "Evicted");
    assert_eq!(
        p["status"]["message"],
        "Pod was rejected: The node had condition: [MemoryPressure]. "
    );

    // A Burstable pod is admitted, then evicted within a round.
    let victim = format!("burstable-{node}");
    let mut pod = bound_pod(&victim, node, 30, "sleep 3600");
    pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "10m"}});
    let created = api.create(pod);
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let p = wait_for("the Burstable pod evicted", T, || {
        api.get("pods", Some("default"), &victim)
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(p["status"]["reason"], "Evicted", "{:#}", p["status"]);
    let msg = p["status"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.starts_with(
            "The node was low on resource: memory. Threshold quantity: 1Pi, available: "
        ),
        "{msg}"
    );
    let d = cond(&p, "DisruptionTarget").expect("a DisruptionTarget condition");
    assert_eq!(d["status"], "True");
    assert_eq!(d["reason"], "TerminationByKubelet");
    assert_eq!(d["message"], msg.as_str());
    let cri = Cri::new();
    wait_for("its containers stopped", T, || {
        (cri.count_labelled("io.kubernetes.pod.uid", &uid, true) == (0, 0)).then_some(())
    });
    let events = api.list("events");
    let e = events
        .iter()
        .find(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == victim.as_str())
        .expect("an Evicted event");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["message"], msg.as_str());
    // Upstream's AnnotatedEventf: what was starved and who used it (the
    // container asked for no memory, so any use offends). Old code: none.
    let notes = &e["metadata"]["annotations"];
    assert_eq!(notes["starved_resource"], "memory", "{e:#}");
    assert_eq!(notes["offending_containers"], "main", "{e:#}");
    assert!(
        notes["offending_containers_usage"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && msg.contains(&format!("was using {u},"))),
        "{e:#}"
    );
    let e = events
        .iter()
        .find(|e| e["reason"] == "EvictionThresholdMet" && e["involvedObject"]["kind"] == "Node")
        .expect("an EvictionThresholdMet event");
    assert_eq!(e["message"], "Attempting to reclaim memory");

    // Within a container GC period, the evicted pod's containers, sandbox
    // and logs go, though the pod stays (upstream ShouldPodContentBeRemoved).
    wait_for(
        "the evicted pod's containers removed",
        Duration::from_secs(90),
        || (cri.count_labelled("io.kubernetes.pod.uid", &uid, false) == (0, 0)).then_some(()),
    );
    let logs = std::path::PathBuf::from(format!("/var/log/pods/default_{victim}_{uid}"));
    wait_for("its logs removed", Duration::from_secs(90), || {
        (!logs.exists()).then_some(())
    });
    let p = api.get("pods", Some("default"), &victim).unwrap();
    assert_eq!(p["status"]["reason"], "Evicted");
    let text = metrics_text(&k);
    assert!(
        text.lines()
            .any(|l| l == "kubelet_evictions{eviction_signal=\"memory.available\"} 1"),
        "{}",
        text.lines()
            .filter(|l| l.contains("eviction"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_pod_over_its_emptydir_size_limit_is_evicted_as_upstream() {
    // Old code: an emptyDir's sizeLimit was never enforced.
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-evict-local";
    // Volume usage measured every 2 s instead of every minute.
    let _k = cluster_kubelet_with(node, &api, "volumeStatsAggPeriod: 2s\n");
    let name = format!("scratch-{node}");
    let mut pod = bound_pod(
        &name,
        node,
        30,
        "dd if=/dev/zero of=/scratch/fill bs=1M count=4; sleep 3600",
    );
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "scratch", "mountPath": "/scratch"}]);
    pod["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]);
    api.create(pod);
    let p = wait_for("the pod evicted", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(p["status"]["reason"], "Evicted", "{:#}", p["status"]);
    assert_eq!(
        p["status"]["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
    // Upstream's local storage evictions set no DisruptionTarget.
    assert!(cond(&p, "DisruptionTarget").is_none(), "{:#}", p["status"]);
    let e = wait_for("an Evicted event", T, || {
        api.list("events")
            .into_iter()
            .find(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == name.as_str())
    });
    assert_eq!(e["type"], "Warning");
    let n = api.get("nodes", None, node).unwrap();
    assert_eq!(cond(&n, "MemoryPressure").unwrap()["status"], "False");
}

/// The kubelet's `/metrics` (anonymous, as the harness allows).
fn metrics_text(k: &Kubelet) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "10"])
        .arg(format!("https://{}/metrics", k.api))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An image no test uses, made for the test: no layers, a config label of
/// its own so its ID is new. Returns its name.
fn import_throwaway_image(dir: &std::path::Path, tag: &str) -> String {
    let layout = dir.join("oci");
    let sh = format!(
        "set -e; rm -rf {l}; umoci init --layout {l}; umoci new --image {l}:v1; \
         umoci config --image {l}:v1 --config.label rkubelet.test={tag}; \
         tar -C {l} -cf {l}.tar .; \
         ctr -n k8s.io images import --base-name localhost/rkubelet-test/{tag} {l}.tar",
        l = layout.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &sh])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("localhost/rkubelet-test/{tag}:v1")
}

/// A container made from busybox (created, never started, without the
/// kubelet's labels, so no kubelet manages it): while it exists, image
/// garbage collection must keep busybox, which every other test needs.
struct BusyboxKeeper {
    cri: Cri,
    sandbox: String,
}

impl BusyboxKeeper {
    fn new(name: &str) -> Self {
        use rkubelet::cri::v1;
        let cri = Cri::new();
        let sandbox = cri.rt.block_on(async {
            let sb = v1::PodSandboxConfig {
                metadata: Some(v1::PodSandboxMetadata {
                    name: name.into(),
                    uid: format!("{name}-uid"),
                    namespace: "rkubelet-test".into(),
                    attempt: 0,
                }),
                ..Default::default()
            };
            let id = cri
                .client
                .run_pod_sandbox(sb.clone(), String::new())
                .await
                .unwrap();
            let c = v1::ContainerConfig {
                metadata: Some(v1::ContainerMetadata {
                    name: "keeper".into(),
                    attempt: 0,
                }),
                image: Some(v1::ImageSpec {
                    image: BUSYBOX.into(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                ..Default::default()
            };
            cri.client.create_container(&id, c, sb).await.unwrap();
            id
        });
        BusyboxKeeper { cri, sandbox }
    }
}

impl Drop for BusyboxKeeper {
    fn drop(&mut self) {
        self.cri.rt.block_on(async {
            for c in self
                .cri
                .client
                .list_containers(None)
                .await
                .unwrap_or_default()
            {
                if c.pod_sandbox_id == self.sandbox {
                    let _ = self.cri.client.remove_container(&c.id).await;
                }
            }
            let _ = self.cri.client.stop_pod_sandbox(&self.sandbox).await;
            let _ = self.cri.client.remove_pod_sandbox(&self.sandbox).await;
        });
    }
}

fn image_names(cri: &Cri) -> Vec<String> {
    cri.rt
        .block_on(cri.client.list_images())
        .unwrap()
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect()
}

#[test]
fn under_disk_pressure_finished_pods_containers_and_unused_images_are_reclaimed_first() {
    // Old code: no image garbage collector and no node-level reclaim; the
    // eviction manager went straight to pods, and images were never
    // removed.
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-reclaim";
    let keeper = BusyboxKeeper::new(&format!("gc-keeper-{node}"));
    let mut k = Kubelet::new(node);
    let victim = import_throwaway_image(&k.dir, &format!("gc-victim-{}", std::process::id()));
    assert!(image_names(&k.cri).contains(&victim));
    // More free space asked for than the disk has: DiskPressure from the
    // first round, and a reclaim every round. Images are collected by the
    // eviction manager's reclaim alone (the periodic collection is off), as
    // soon as they have been seen.
    let kc = kubeconfig(&api, &k.dir, node);
    k.extra_args = vec![
        "--kubeconfig".into(),
        kc.display().to_string(),
        format!("--cert-dir={}", k.dir.join("pki").display()),
    ];
    k.extra_config =
        "nodeStatusUpdateFrequency: 1s\nnodeLeaseDurationSeconds: 4\nsyncFrequency: 5s\n\
        evictionHard:\n  imagefs.available: \"99%\"\nimageMinimumGCAge: 1ms\n"
            .into();
    k.spawn();
    // A static pod is critical, so admitted under disk pressure; it
    // finishes at once, and its worker is done with it.
    k.write_manifest("done.yaml", &simple_pod("done", "true", "Never"));
    let name = format!("done-{node}");
    wait_for("the static pod to succeed", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["status"]["phase"] == "Succeeded")
    });
    let n = api.get("nodes", None, node).unwrap();
    assert_eq!(
        cond(&n, "DiskPressure").unwrap()["status"],
        "True",
        "{:#}",
        n["status"]
    );

    wait_for("the unused image removed", T, || {
        (!image_names(&k.cri).contains(&victim)).then_some(())
    });
    wait_for(
        "the finished pod's containers and sandbox removed",
        T,
        || (k.cri.count_labelled("io.kubernetes.pod.name", &name, false) == (0, 0)).then_some(()),
    );
    // Pinned (the sandbox image) and used (by the keeper) images stay.
    let left = image_names(&k.cri);
    assert!(left.iter().any(|n| n == BUSYBOX), "{left:?}");
    assert!(left.iter().any(|n| n.contains("/pause:")), "{left:?}");
    // The pod stays Succeeded; nothing was evicted (no pod was running).
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_eq!(p["status"]["phase"], "Succeeded");
    let events = api.list("events");
    let e = events
        .iter()
        .find(|e| e["reason"] == "EvictionThresholdMet")
        .expect("an EvictionThresholdMet event");
    assert_eq!(e["message"], "Attempting to reclaim ephemeral-storage");
    assert!(!events.iter().any(|e| e["reason"] == "Evicted"));

    let text = metrics_text(&k);
    // At least the throwaway image (any other unused image goes too).
    let removed = text
        .lines()
        .find_map(|l| l.strip_prefix("kubelet_image_garbage_collected_total{reason=\"space\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        removed.is_some_and(|n| n >= 1),
        "{}",
        text.lines()
            .filter(|l| l.contains("garbage"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(k);
    drop(keeper);
}

#[test]
fn sysctls_are_admitted_as_upstreams_allowlist_and_reach_the_pod() {
    // Old code: no sysctl admit handler; any sysctl went to the runtime,
    // and allowedUnsafeSysctls was accepted unread.
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-sysctl";
    let k = cluster_kubelet_with(node, &api, "allowedUnsafeSysctls:\n- kernel.msg*\n");
    let with = |name: &str, sysctls: Value, host_network: bool| {
        let mut p = bound_pod(
            name,
            node,
            1,
            "cat /proc/sys/kernel/msgmax; exec sleep 3600",
        );
        p["spec"]["securityContext"] = json!({ "sysctls": sysctls });
        p["spec"]["hostNetwork"] = json!(host_network);
        api.create(p);
    };
    let allowed = format!("allowed-{node}");
    with(
        &allowed,
        json!([{"name": "kernel.msgmax", "value": "12345"}, {"name": "net/ipv4/tcp_syncookies", "value": "1"}]),
        false,
    );
    let unsafe_ = format!("unsafe-{node}");
    with(
        &unsafe_,
        json!([{"name": "kernel.sem", "value": "250 32000 32 128"}]),
        false,
    );
    let host_net = format!("hostnet-{node}");
    with(
        &host_net,
        json!([{"name": "net.ipv4.tcp_syncookies", "value": "1"}]),
        true,
    );

    for (name, message) in [
        (&unsafe_, "Pod was rejected: forbidden sysctl: \"kernel.sem\" not allowlisted"),
        (
            &host_net,
            "Pod was rejected: forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled",
        ),
    ] {
        let p = wait_for("the pod refused", T, || {
            api.get("pods", Some("default"), name)
                .filter(|p| p["status"]["phase"] == "Failed")
        });
        assert_eq!(p["status"]["reason"], "SysctlForbidden");
        assert_eq!(p["status"]["message"], message);
        assert_eq!(k.cri.count_labelled("io.kubernetes.pod.name", name, false), (0, 0));
    }
    // The allowed unsafe sysctl is set in the pod's own IPC namespace.
    ready_pod(&api, &allowed, "the pod with allowed sysctls");
    let logs = wait_for("its output", T, || {
        let l = container_logs(&k, &allowed, "main");
        l.starts_with("12345\n").then_some(l)
    });
    assert!(logs.ends_with("200"), "{logs}");
}

#[test]
fn without_cpu_cfs_quota_a_cpu_limit_sets_no_quota() {
    // Old code: cpuCFSQuota was accepted unread; every cpu limit became a
    // CFS quota.
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-nocfs";
    let k = cluster_kubelet_with(node, &api, "cpuCFSQuota: false\n");
    let name = format!("limited-{node}");
    let mut pod = bound_pod(
        &name,
        node,
        1,
        "q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max); \
         echo \"quota=$q\"; exec sleep 3600",
    );
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m"},
        "limits": {"cpu": "200m"}
    });
    api.create(pod);
    let p = ready_pod(&api, &name, "the pod running");
    let logs = wait_for("the quota printed", T, || {
        let l = container_logs(&k, &name, "main");
        l.contains("quota=").then_some(l)
    });
    // cgroup v1 shows no quota as -1, v2 as "max".
    assert!(
        logs.contains("quota=-1\n") || logs.contains("quota=max "),
        "{logs}"
    );
    // The limit is still the pod's, and nothing takes the runtime's
    // settings for a resize to make.
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["resources"]["limits"]["cpu"], "200m", "{cs:#}");
    assert!(
        cond(&p, "PodResizeInProgress").is_none(),
        "{:#}",
        p["status"]
    );
}

/// A file of a cgroup on the host, relative to its hierarchy's root: the
/// v1 controller's file, or the v2 one in the unified hierarchy.
fn host_cgroup(controller: &str, dir: &str, v1: &str, v2: &str) -> String {
    let unified = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let path = if unified {
        format!("/sys/fs/cgroup/{dir}/{v2}")
    } else {
        format!("/sys/fs/cgroup/{controller}/{dir}/{v1}")
    };
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// A cgroup's cpu quota in microseconds ("max" or -1 for none).
fn pod_cpu_quota(dir: &str) -> String {
    let q = host_cgroup("cpu", dir, "cpu.cfs_quota_us", "cpu.max");
    q.split(' ').next().unwrap_or_default().to_string()
}

/// cpu.shares on v1, or what it is as cpu.weight on v2.
fn host_cpu_weight(dir: &str, shares: u64) -> (String, String) {
    let unified = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let want = if unified {
        1 + (shares - 2) * 9999 / 262_142
    } else {
        shares
    };
    (
        host_cgroup("cpu", dir, "cpu.shares", "cpu.weight"),
        want.to_string(),
    )
}

/// The container manager's cgroups, as upstream's (old code left them to
/// the runtime, bare): the pod's own cgroup is made with its limits and
/// podPidsLimit before its sandbox, the QoS tiers carry their shares, and
/// kubepods the node's.
#[test]
fn pod_cgroups_carry_the_pods_limits_as_upstreams_container_manager() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-cgroups";
    let k = cluster_kubelet_with(node, &api, "podPidsLimit: 77\n");
    let name = format!("limited-{node}");
    // Each container limits cpu, one leaves memory open: the pod gets a
    // quota of both limits and no memory limit.
    let mut pod = bound_pod(&name, node, 1, "exec sleep 3600");
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "memory": "32Mi"},
        "limits": {"cpu": "200m", "memory": "64Mi"}
    });
    let mut second = pod["spec"]["containers"][0].clone();
    second["name"] = json!("second");
    second["resources"] = json!({"requests": {"cpu": "50m"}, "limits": {"cpu": "100m"}});
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(second);
    let created = api.create(pod);
    assert_eq!(created["status"]["qosClass"], "Burstable");
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    ready_pod(&api, &name, "the pod running");
    let dir = format!("kubepods/burstable/pod{uid}");
    assert_eq!(host_cgroup("pids", &dir, "pids.max", "pids.max"), "77");
    assert_eq!(pod_cpu_quota(&dir), "30000");
    let (have, want) = host_cpu_weight(&dir, 153);
    assert_eq!(have, want, "the pod's shares of its 150m request");
    let memory = host_cgroup("memory", &dir, "memory.limit_in_bytes", "memory.max");
    assert!(
        memory == "max" || memory.parse::<u64>().unwrap() > 1 << 60,
        "no memory limit: {memory}"
    );
    // BestEffort's tier at the minimum; burstable's at least this pod's
    // requests (other kubelets' pods may share it).
    let (have, want) = host_cpu_weight("kubepods/besteffort", 2);
    assert_eq!(have, want);
    wait_for("the burstable tier's shares", T, || {
        let (have, _) = host_cpu_weight("kubepods/burstable", 2);
        let (_, floor) = host_cpu_weight("kubepods/burstable", 153);
        (have.parse::<u64>().ok()? >= floor.parse::<u64>().ok()?).then_some(())
    });
    // kubepods: the node's cpu in shares, and a pid limit (not "max").
    let cores: u64 = wait_for("the node's capacity", T, || {
        api.get("nodes", None, node)?["status"]["capacity"]["cpu"]
            .as_str()?
            .parse()
            .ok()
    });
    let (have, want) = host_cpu_weight("kubepods", cores * 1024);
    assert_eq!(have, want);
    let pids = host_cgroup("pids", "kubepods", "pids.max", "pids.max");
    assert!(pids.parse::<u64>().is_ok(), "kubepods pids.max {pids}");
    wait_for("the node allocatable event", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "SuccessfulNodeAllocatableEnforcement"
                && e["involvedObject"]["name"] == node
        })
    });
    drop(k);
}

/// Upstream's SyncTerminatedPod tears a finished pod's volumes down and
/// then its pod cgroup goes, though the pod stays in the API (for its
/// status and logs). Old code kept both until the pod was deleted: a
/// memory-backed volume of every completed Job pod held its memory.
#[test]
fn a_finished_pod_gives_up_its_volumes_and_cgroup_though_it_stays() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-finished";
    let k = cluster_kubelet(node, &api);
    let name = format!("done-{node}");
    let mut pod = bound_pod(
        &name,
        node,
        1,
        "echo hi > /mem/x && grep ' /mem ' /proc/mounts && grep -E ':cpu,|:cpu:|^0::' /proc/self/cgroup",
    );
    pod["spec"]["restartPolicy"] = json!("Never");
    pod["spec"]["volumes"] = json!([{"name": "mem", "emptyDir": {"medium": "Memory"}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "mem", "mountPath": "/mem"}]);
    let created = api.create(pod);
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    wait_for("the pod Succeeded", T, || {
        api.get("pods", Some("default"), &name)
            .filter(|p| p["status"]["phase"] == "Succeeded")
    });
    // It ran on the tmpfs, in its own pod cgroup.
    let logs = container_logs(&k, &name, "main");
    assert!(logs.contains("tmpfs /mem tmpfs"), "{logs}");
    assert!(logs.contains(&format!("pod{uid}")), "{logs}");
    let vol = k
        .dir
        .join("root/pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/mem");
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(vol.to_str().unwrap()))
    };
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let cgroup = if v2 {
        format!("/sys/fs/cgroup/kubepods/besteffort/pod{uid}")
    } else {
        format!("/sys/fs/cgroup/cpu/kubepods/besteffort/pod{uid}")
    };
    wait_for("the volume torn down and the pod cgroup removed", T, || {
        (!mounted() && !std::path::Path::new(&cgroup).exists()).then_some(())
    });
    // The pod stays, Succeeded, with its logs.
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_eq!(p["status"]["phase"], "Succeeded");
    assert!(container_logs(&k, &name, "main").contains("hi") || !logs.is_empty());
}
