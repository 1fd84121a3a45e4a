//! The authenticated port (:10250) with kubectl as a real client: TLS,
//! x509 client certificates against `clientCAFile`, bearer tokens through
//! TokenReview and SubjectAccessReview on the API server double (a double,
//! not a real kube-apiserver; see `common::apiserver`), upstream's 401/403
//! bodies, the read-only port's connection limits.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::apiserver::{ApiServer, ApiServerOptions};
use common::*;

const T: Duration = Duration::from_secs(90);

/// A kubeconfig for kubectl against the kubelet at `addr` (the serving
/// certificate is self-signed for the node's name, so not verified).
fn kubectl_config(dir: &Path, name: &str, addr: &str, user: &str) -> PathBuf {
    let path = dir.join(format!("kubectl-{name}.conf"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://{addr}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}

/// `kubectl get --raw path`: Ok(stdout) or Err(stderr).
fn kubectl_raw(config: &Path, path: &str) -> Result<String, String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .args(["get", "--raw", path, "--request-timeout=10s"])
        .output()
        .expect("run kubectl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// How kubectl reports a 401 (client-go's text for StatusUnauthorized).
fn is_401(stderr: &str) -> bool {
    stderr.contains("You must be logged in to the server")
}

fn cert_user(api: &ApiServer, dir: &Path, cn: &str) -> String {
    let (cert, key) = api.issue_client_cert(cn, &["ops"], Duration::from_secs(3600));
    let (c, k) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    format!(
        "    client-certificate: {}\n    client-key: {}\n",
        c.display(),
        k.display()
    )
}

#[test]
fn kubectl_meets_upstreams_authentication_and_authorization() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-api";
    let mut k = Kubelet::new(node);
    // The kubelet's own client certificate for the API server.
    let kc = api.node_kubeconfig(&k.dir, node);
    let ca = k.dir.join("client-ca.crt");
    std::fs::write(&ca, api.ca_pem()).unwrap();
    k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
    k.extra_config = format!(
        "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\n  x509:\n    clientCAFile: {}\nauthorization:\n  mode: Webhook\n",
        ca.display()
    );
    // alice may use nodes/proxy (so /pods through the fallback) and
    // nodes/metrics, carol only nodes/healthz; bob nothing.
    api.allow("alice", "get", "nodes", "proxy");
    api.allow("alice", "get", "nodes", "metrics");
    api.allow("carol", "get", "nodes", "healthz");
    api.add_token("carol-token", "carol", &["ops"]);
    k.spawn();
    let dir = k.dir.clone();

    // No credentials, anonymous off: 401, with upstream's body (curl:
    // kubectl without credentials prompts for a password instead).
    let url = format!("https://{}/pods", k.api);
    let (code, body) = wait_for(":10250 to answer over TLS", T, || {
        let out = Command::new("curl")
            .args(["-sk", "-w", "\n%{http_code}", &url])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n')?;
        (code != "000").then(|| (code.to_string(), body.to_string()))
    });
    assert_eq!((code.as_str(), body.as_str()), ("401", "Unauthorized"));

    // A certificate from the client CA, allowed by the webhook: 200.
    let alice = kubectl_config(&dir, "alice", &k.api, &cert_user(&api, &dir, "alice"));
    let pods = wait_for("alice's /pods", T, || kubectl_raw(&alice, "/pods").ok());
    let v: serde_json::Value = serde_json::from_str(&pods).expect("a PodList");
    assert_eq!(v["kind"], "PodList");
    // Fine-grained authorization asked nodes/pods first, then nodes/proxy.
    let sars = || api.count_requests("POST", "subjectaccessreviews");
    assert!(sars() >= 2, "{} SubjectAccessReviews", sars());
    // Decisions are cached: the same request asks nothing new.
    let before = sars();
    kubectl_raw(&alice, "/pods").expect("alice again");
    assert_eq!(sars(), before, "cached decisions");
    // A metric endpoint through Go's HTTP client, which asks for gzip and
    // decodes it (the kubelet answers gzipped, as upstream's promhttp).
    let text = kubectl_raw(&alice, "/metrics/resource").expect("alice's resource metrics");
    assert!(
        text.contains("# TYPE node_cpu_usage_seconds_total counter"),
        "{text}"
    );

    // A certificate from the client CA the webhook denies: 403, naming
    // every subresource checked, as upstream.
    let bob = kubectl_config(&dir, "bob", &k.api, &cert_user(&api, &dir, "bob"));
    let e = kubectl_raw(&bob, "/pods").expect_err("bob is forbidden");
    assert!(
        e.contains("Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])"),
        "{e}"
    );
    let e = kubectl_raw(&bob, "/stats/summary").expect_err("bob is forbidden");
    assert!(e.contains("subresource(s)=[stats])"), "{e}");

    // A certificate from another CA: 401.
    let other = rcgen::generate_simple_self_signed(vec!["mallory".into()]).unwrap();
    let (oc, ok) = (dir.join("mallory.crt"), dir.join("mallory.key"));
    std::fs::write(&oc, other.cert.pem()).unwrap();
    std::fs::write(&ok, other.signing_key.serialize_pem()).unwrap();
    let mallory = kubectl_config(
        &dir,
        "mallory",
        &k.api,
        &format!(
            "    client-certificate: {}\n    client-key: {}\n",
            oc.display(),
            ok.display()
        ),
    );
    let e = kubectl_raw(&mallory, "/pods").expect_err("unknown CA");
    assert!(is_401(&e), "{e}");

    // A bearer token through TokenReview: carol may read /healthz through
    // nodes/healthz, but not /pods; an unknown token is 401.
    let carol = kubectl_config(&dir, "carol", &k.api, "    token: carol-token\n");
    assert_eq!(
        kubectl_raw(&carol, "/healthz").expect("carol healthz"),
        "ok"
    );
    let e = kubectl_raw(&carol, "/pods").expect_err("carol may not list pods");
    assert!(e.contains("Forbidden (user=carol"), "{e}");
    assert!(api.count_requests("POST", "tokenreviews") >= 1);
    let wrong = kubectl_config(&dir, "wrong", &k.api, "    token: not-a-token\n");
    let e = kubectl_raw(&wrong, "/healthz").expect_err("unknown token");
    assert!(is_401(&e), "{e}");

    // A new CA added to clientCAFile is taken without a restart: alice's
    // certificate from it is refused before and accepted after.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "second-ca");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::default();
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let (lc, lk) = (dir.join("alice2.crt"), dir.join("alice2.key"));
    std::fs::write(&lc, leaf_cert.pem()).unwrap();
    std::fs::write(&lk, leaf_key.serialize_pem()).unwrap();
    let alice2 = kubectl_config(
        &dir,
        "alice2",
        &k.api,
        &format!(
            "    client-certificate: {}\n    client-key: {}\n",
            lc.display(),
            lk.display()
        ),
    );
    let e = kubectl_raw(&alice2, "/pods").expect_err("a CA not in the bundle yet");
    assert!(is_401(&e), "{e}");
    std::fs::write(&ca, format!("{}{}", api.ca_pem(), ca_cert.pem())).unwrap();
    wait_for("the reloaded client CA to accept alice2", T, || {
        kubectl_raw(&alice2, "/pods").ok()
    });
}

#[test]
fn slow_and_oversized_clients_cannot_starve_the_server() {
    let k = Kubelet::start("it-api-limits");
    // Clients that open a request and never finish its headers.
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(&k.read_only).unwrap();
            s.write_all(b"GET /pods HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    // Others are served meanwhile.
    let (code, _) = http_get(&k.read_only, "/healthz").expect("healthz while slow clients wait");
    assert_eq!(code, 200);
    // Headers beyond upstream's 1 MiB: refused (431) or the connection is
    // closed, never buffered without bound.
    let mut big = TcpStream::connect(&k.read_only).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = big.write_all(b"GET /pods HTTP/1.1\r\nHost: x\r\nX-Big: ");
    let chunk = vec![b'a'; 64 * 1024];
    for _ in 0..40 {
        if big.write_all(&chunk).is_err() {
            break;
        }
    }
    let mut resp = Vec::new();
    let _ = big.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "oversized headers answered: {text:?}"
    );
    // The slow clients are cut off at the header read timeout.
    let s = &mut slow[0];
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = Vec::new();
    let r = s.read_to_end(&mut buf);
    assert!(
        r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the slow connection was not closed: {r:?}"
    );
    let (code, _) = http_get(&k.read_only, "/healthz").expect("healthz after");
    assert_eq!(code, 200);
}

#[test]
fn debug_pods_explains_a_crash_looping_pod() {
    let k = Kubelet::start("it-api-debug");
    k.write_manifest(
        "crash.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: crash\nspec:\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'exit 3']\n    readinessProbe:\n      exec:\n        command: ['true']\n"
        ),
    );
    let url = format!("https://{}/debug/pods/default/crash-it-api-debug", k.api);
    let get = || -> Option<serde_json::Value> {
        let out = Command::new("curl").args(["-sk", &url]).output().ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    // The container keeps failing: its restart backoff shows, with its
    // window, next to the worker's phase and the last computed actions.
    let v = wait_for("a restart backoff entry in /debug/pods", T, || {
        get().filter(|v| {
            v["restartBackoff"]
                .as_array()
                .is_some_and(|b| b.iter().any(|e| e["container"] == "main"))
        })
    });
    assert_eq!(v["pod"]["namespace"], "default");
    assert_eq!(v["worker"]["phase"], "Syncing", "{v}");
    assert!(v["restartBackoff"][0]["window"]
        .as_str()
        .is_some_and(|w| w.ends_with('s')));
    assert!(v["lastActions"]["at"].is_string(), "{v}");
    assert!(
        v["probes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["container"] == "main" && p["probe"] == "Readiness"),
        "{v}"
    );
    assert!(v["status"]["phase"].is_string());
    // An unknown pod is a 404.
    let out = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("https://{}/debug/pods/default/nope", k.api),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404");
}

/// A request over TLS with curl (anonymous; the tests' kubelets allow it)
/// with `args` before the URL: (status, body).
fn curl_with(args: &[&str], url: &str) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sk", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    (code.to_string(), body.to_string())
}

/// GET over TLS with curl: (status, body). `max_secs` bounds a follow.
fn curl(url: &str, max_secs: u32) -> (String, String) {
    curl_with(&["-N", "--max-time", &max_secs.to_string()], url)
}

/// The numbers of `line-N` lines, in order.
fn numbers(body: &str) -> Vec<u64> {
    body.lines()
        .filter_map(|l| l.strip_prefix("line-")?.parse().ok())
        .collect()
}

#[test]
fn container_logs_tail_follow_across_a_rotation_and_previous() {
    use rkubelet::cri::RuntimeService;
    let k = Kubelet::start("it-api-logs");
    k.write_manifest(
        "talker.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: talker\nspec:\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'i=0; while true; do echo line-$i; i=$((i+1)); sleep 0.1; done']\n  - name: once\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'echo started-$(cat /proc/uptime); sleep 2; exit 1']\n"
        ),
    );
    let base = format!("https://{}/containerLogs/default/talker-it-api-logs", k.api);
    wait_for("some lines logged", T, || {
        let (code, body) = curl(&format!("{base}/main"), 10);
        (code == "200" && numbers(&body).len() >= 5).then_some(())
    });

    // tailLines: exactly the last lines (the legacy `tail` too); bad
    // values as upstream: 422 for invalid ones, 400 for undecodable ones.
    for q in ["tailLines=2", "tail=2"] {
        let (code, body) = curl(&format!("{base}/main?{q}"), 10);
        assert_eq!(code, "200");
        let n = numbers(&body);
        assert_eq!(n.len(), 2, "{body}");
        assert_eq!(n[1], n[0] + 1);
    }
    for (bad, want) in [
        ("tailLines=-1", "422"),
        ("limitBytes=0", "422"),
        ("sinceSeconds=0", "422"),
        ("tailLines=two", "400"),
    ] {
        let (code, body) = curl(&format!("{base}/main?{bad}"), 10);
        assert_eq!(code, want, "{bad}: {body}");
    }
    let (code, _) = curl(&format!("{base}/nope"), 10);
    assert_eq!(code, "404");
    let (code, body) = curl(&format!("{base}/main?limitBytes=7"), 10);
    assert_eq!((code.as_str(), body.len()), ("200", 7), "{body}");

    // follow: a client reads for 6 s while the log is rotated the way
    // upstream's rotation does it (rename, then ReopenContainerLog); the
    // lines it saw run on without a gap across the rotation.
    let cid = k.cri.rt.block_on(async {
        let filter = rkubelet::cri::ContainerFilter {
            label_selector: [(
                "io.kubernetes.container.name".to_string(),
                "main".to_string(),
            )]
            .into_iter()
            .chain([(
                "io.kubernetes.pod.name".to_string(),
                "talker-it-api-logs".to_string(),
            )])
            .collect(),
            ..Default::default()
        };
        let list = k.cri.client.list_containers(Some(filter)).await.unwrap();
        list.into_iter().max_by_key(|c| c.created_at).unwrap().id
    });
    let log_path = k
        .cri
        .rt
        .block_on(k.cri.client.container_status(&cid))
        .unwrap()
        .log_path;
    let follow_url = format!("{base}/main?follow=true&tailLines=1");
    let follower = std::thread::spawn(move || curl(&follow_url, 6));
    // Let the follower read some lines first (a duration, not a sync: the
    // test checks continuity, whatever the timing).
    std::thread::sleep(Duration::from_secs(2));
    std::fs::rename(&log_path, format!("{log_path}.20261123-000000")).unwrap();
    k.cri
        .rt
        .block_on(k.cri.client.reopen_container_log(&cid))
        .unwrap();
    let (_, followed) = follower.join().unwrap();
    let seen = numbers(&followed);
    assert!(seen.len() >= 30, "the follower saw {} lines", seen.len());
    for w in seen.windows(2) {
        assert_eq!(
            w[1],
            w[0] + 1,
            "a gap or repeat across the rotation: {seen:?}"
        );
    }
    // The new file has lines the follower also saw: it followed the
    // rotation rather than stopping at the old file's end.
    let fresh = numbers(
        &std::fs::read_to_string(&log_path)
            .unwrap()
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3))
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    );
    assert!(
        fresh.first().is_some_and(|f| seen.contains(f)),
        "the follower missed the rotated file: {:?} vs {:?}",
        fresh.first(),
        seen.last()
    );

    // previous: the last terminated instance of a restarting container.
    let (prev, cur) = wait_for("a previous instance of 'once'", T, || {
        let (code, prev) = curl(&format!("{base}/once?previous=true"), 10);
        let (_, cur) = curl(&format!("{base}/once"), 10);
        (code == "200"
            && prev.starts_with("started-")
            && cur.starts_with("started-")
            && prev != cur)
            .then_some((prev, cur))
    });
    assert_ne!(prev, cur);
    // No previous instance yet for main: 400 with upstream's message.
    let (code, body) = curl(&format!("{base}/main?previous=true"), 10);
    assert_eq!(code, "400", "{body}");
    assert!(body.contains("previous terminated container"), "{body}");
}

#[test]
fn container_logs_are_rotated_compressed_and_pruned_as_configured() {
    let mut k = Kubelet::new("it-api-rotate");
    k.extra_config =
        "containerLogMaxSize: 2Ki\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 3s\n"
            .into();
    k.spawn();
    k.write_manifest(
        "chatty.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: chatty\nspec:\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'i=0; while true; do echo line-$i; i=$((i+1)); sleep 0.02; done']\n"
        ),
    );
    let pod = k.wait_pod("chatty", "running", T, |p| running(p, "main"));
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let dir = std::path::PathBuf::from(format!(
        "/var/log/pods/default_chatty-it-api-rotate_{uid}/main"
    ));
    let listing = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    // Rotated, older rotations compressed, and the current file there
    // again: a rotation renames 0.log before the runtime reopens it, so a
    // listing may fall between the two (as upstream's rotation).
    wait_for("a compressed rotated log and a current one", T, || {
        let v = listing();
        (v.iter().any(|n| n.ends_with(".gz")) && v.contains(&"0.log".to_string())).then_some(())
    });
    // Never more than containerLogMaxFiles in all (the current one, one
    // uncompressed and the compressed rest), checked over a few rounds.
    for _ in 0..5 {
        let v = listing();
        let ours = v.iter().filter(|n| n.starts_with("0.log")).count();
        assert!(ours <= 3, "more than containerLogMaxFiles: {v:?}");
        let (code, body) = curl(
            &format!(
                "https://{}/containerLogs/default/chatty-it-api-rotate/main?tailLines=3",
                k.api
            ),
            10,
        );
        assert_eq!(code, "200");
        // The current file only (as upstream): just after a rotation it
        // may hold fewer lines, never more than asked, never out of order.
        let n = numbers(&body);
        assert!(n.len() <= 3, "{body}");
        assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "{body}");
        std::thread::sleep(Duration::from_millis(700));
    }
}

/// PUT over TLS with curl: (status, body).
fn curl_put(url: &str, data: &str) -> (String, String) {
    curl_with(&["-X", "PUT", "--data-binary", data], url)
}

/// The config file's `logging.verbosity` is the log level when no `-v` is
/// given, as upstream applies `logging` after merging flags and file
/// (rkubelet logged at 0 whatever the file said), and `PUT /debug/flags/v`
/// changes it while running (upstream's `logs.GlogSetter`).
#[test]
fn log_verbosity_comes_from_the_config_file_and_changes_over_debug_flags_v() {
    let mut k = Kubelet::new("it-api-verbosity");
    k.extra_config = "logging:\n  verbosity: 4\n".into();
    k.spawn();
    let log = k.dir.join("rkubelet.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // DEBUG lines are written from -v 2 on.
    wait_for("DEBUG lines at the file's verbosity 4", T, || {
        read().contains(" DEBUG ").then_some(())
    });
    let url = format!("https://{}/debug/flags/v", k.api);
    assert_eq!(
        curl_put(&url, "x"),
        (
            "400".into(),
            "strconv.ParseUint: parsing \"x\": invalid syntax\n".into()
        )
    );
    assert_eq!(
        curl_put(&url, "0"),
        (
            "200".into(),
            "successfully set klog.logging.verbosity to 0\n".into()
        )
    );
    // At 0, a pod's whole start logs no DEBUG line.
    let from = read().len();
    k.write_manifest("v.yaml", &simple_pod("v", "sleep 3600", "Always"));
    k.wait_pod("v", "Running", T, |p| running(p, "main"));
    let quiet = read()[from..].to_string();
    assert!(!quiet.contains(" DEBUG "), "{quiet}");
    // Back at 4, its removal does.
    assert_eq!(curl_put(&url, "4").0, "200");
    let from = read().len();
    k.remove_manifest("v.yaml");
    wait_for("DEBUG lines again at verbosity 4", T, || {
        read()[from..].contains(" DEBUG ").then_some(())
    });
}

/// `POST /checkpoint/{namespace}/{pod}/{container}` (upstream's handler,
/// gate ContainerCheckpoint on by default): 404s for what the pod manager
/// does not know, and the runtime's own answer for a running container
/// (containerd 1.7 does not implement CheckpointContainer: a 500 naming it,
/// as upstream answers; a runtime that does writes the file).
#[test]
fn checkpoint_asks_the_runtime_for_a_running_container() {
    let k = Kubelet::start("it-api-ckpt");
    k.write_manifest("c.yaml", &simple_pod("c", "sleep 3600", "Always"));
    let pod = k.wait_pod("c", "Running", T, |p| running(p, "main"));
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let post = |path: &str| curl_with(&["-X", "POST"], &format!("https://{}{path}", k.api));
    assert_eq!(
        post("/checkpoint/default/nope/main"),
        ("404".into(), "pod does not exist".into())
    );
    assert_eq!(
        post(&format!("/checkpoint/default/{name}/nope")),
        ("404".into(), "container nope does not exist".into())
    );
    let (code, body) = post(&format!("/checkpoint/default/{name}/main?timeout=20"));
    eprintln!("the runtime's answer: {code} {body}");
    match code.as_str() {
        "200" => {
            let v: serde_json::Value = serde_json::from_str(&body).expect(&body);
            let path = v["items"][0].as_str().expect(&body);
            assert!(std::path::Path::new(path).exists(), "{path}");
        }
        _ => {
            assert_eq!(code, "500", "{body}");
            let want = format!("checkpointing of default/{name}/main failed (rpc error: code = ");
            assert!(body.starts_with(&want), "{body}");
        }
    }
    assert!(k.dir.join("root/checkpoints").is_dir());
}
