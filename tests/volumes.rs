//! Pod data in cluster mode, against the in-process double of the API
//! server (`common::apiserver`: a double, not a real kube-apiserver), with
//! rkubelet on the machine's real containerd: the service-account volume
//! the API server's admission adds, ConfigMap and Secret volumes and env,
//! live updates, token refresh, tmpfs for secrets and Memory emptyDirs,
//! hostPath types, a PVC on a hostPath PV, a raw block claim on a local PV
//! (a loop device), and nothing left behind.

mod common;

use std::path::Path;
use std::time::Duration;

use common::apiserver::{ApiServer, ApiServerOptions};
use common::*;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(90);

fn cluster_kubelet(node: &str, api: &ApiServer) -> Kubelet {
    let mut k = Kubelet::new(node);
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
    k.extra_config =
        "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 5s\nvolumeStatsAggPeriod: 1s\n".into();
    k.spawn();
    k
}

fn container_id(p: &Value, i: usize) -> String {
    p["status"]["containerStatuses"][i]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

/// The mount at `path` in this process's view: (fs type, super options).
fn mount_at(path: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&path.to_str().unwrap()) {
            return None;
        }
        let sep = f.iter().position(|x| *x == "-")?;
        Some((f[sep + 1].to_string(), f[sep + 3].to_string()))
    })
}

fn running_pod(api: &ApiServer, name: &str) -> Value {
    wait_for(&format!("pod {name} Running in the API"), T, || {
        api.get("pods", Some("default"), name).filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().all(|c| c["state"]["running"].is_object()))
        })
    })
}

/// Waits for a FailedMount event of `pod` whose message `ok` accepts.
fn failed_mount(api: &ApiServer, pod: &str, ok: impl Fn(&str) -> bool) -> Value {
    wait_for(&format!("a FailedMount event for {pod}"), T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == pod
                && e["message"].as_str().is_some_and(&ok)
        })
    })
}

#[test]
fn configmaps_secrets_and_tokens_reach_the_pod_as_upstream_provides_them() {
    let api = ApiServer::start(ApiServerOptions {
        service_account_admission: true,
        ..Default::default()
    });
    // Short-lived tokens (upstream's --service-account-max-token-expiration)
    // so the refresh at 80 % of their life happens within the test.
    api.set_max_token_expiration(Duration::from_secs(20));
    let node = "it-vol";
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    api.publish_root_ca("default");
    api.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default"},
        "data": {"key": "v1", "other": "o"}}));
    api.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "sec", "namespace": "default"},
        "type": "Opaque", "data": {"pw": "czNjcmV0"}}));
    let k = cluster_kubelet(node, &api);
    let name = format!("data-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "data"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "sec", "secret": {"secretName": "sec"}},
                {"name": "sec2", "secret": {"secretName": "sec", "defaultMode": 256}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}
            ],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "env": [{"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "key"}}}],
                "envFrom": [{"prefix": "P_", "configMapRef": {"name": "cfg"}}],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/cfg"},
                    {"name": "cfg", "mountPath": "/cfg-sub/key", "subPath": "key"},
                    {"name": "sec", "mountPath": "/sec"},
                    {"name": "sec2", "mountPath": "/sec2"},
                    {"name": "mem", "mountPath": "/mem"},
                    {"name": "info", "mountPath": "/info"}
                ]
            }]
        }
    }));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let id = container_id(&p, 0);

    // The API server's admission added kube-api-access-*: token, CA and
    // namespace where every client library looks for them.
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(sh(&k, &id, &format!("cat {sa}/namespace")), "default");
    assert_eq!(
        sh(&k, &id, &format!("cat {sa}/ca.crt")),
        api.ca_pem().trim()
    );
    let token1 = sh(&k, &id, &format!("cat {sa}/token"));
    assert_eq!(token1.split('.').count(), 3, "a JWT: {token1}");
    let reqs = api.token_requests();
    let (ns, sa_name, spec) = reqs.last().expect("a TokenRequest was made");
    assert_eq!((ns.as_str(), sa_name.as_str()), ("default", "default"));
    assert_eq!(spec["boundObjectRef"]["kind"], "Pod");
    assert_eq!(spec["boundObjectRef"]["uid"], uid.as_str());
    assert_eq!(spec["expirationSeconds"], 3607);

    // Referenced objects are watched one by one (upstream's Watch
    // strategy: a metadata.name field selector each), never listed
    // cluster-wide (the node authorizer would refuse it).
    let reads = api.requests();
    for (res, obj) in [("configmaps", "cfg"), ("secrets", "sec")] {
        let one = format!("/namespaces/default/{res}?");
        let sel = format!("fieldSelector=metadata.name%3D{obj}");
        assert!(
            reads.iter().any(|r| r.path.contains(&sel)),
            "{res}: {obj} watched"
        );
        for r in reads.iter().filter(|r| r.path.contains(&one)) {
            assert!(
                r.path.contains("fieldSelector=metadata.name%3D"),
                "{}",
                r.path
            );
        }
        let cluster_wide = format!("/api/v1/{res}");
        assert!(
            !reads.iter().any(|r| r.path.starts_with(&cluster_wide)),
            "{res}"
        );
    }
    // ConfigMap as files and env; Secret files 0644 by default, defaultMode
    // honoured; the downward API.
    assert_eq!(sh(&k, &id, "cat /cfg/key /cfg/other"), "v1o");
    assert_eq!(sh(&k, &id, "cat /cfg-sub/key"), "v1");
    assert_eq!(sh(&k, &id, "echo $FROM_CM $P_key $P_other"), "v1 v1 o");
    assert_eq!(sh(&k, &id, "cat /sec/pw"), "s3cret");
    assert_eq!(sh(&k, &id, "stat -L -c %a /sec/pw"), "644");
    assert_eq!(sh(&k, &id, "stat -L -c %a /sec2/pw"), "400");
    assert_eq!(sh(&k, &id, "cat /info/labels"), "app=\"data\"");
    // API-data volumes are read-only in the container whatever the
    // volumeMount says (upstream's plugins: GetAttributes().ReadOnly); an
    // emptyDir is not.
    for dir in ["/cfg", "/sec", "/info", sa] {
        let w = format!("touch {dir}/x 2>/dev/null && echo rw || echo ro");
        assert_eq!(sh(&k, &id, &w), "ro", "{dir}");
    }
    assert_eq!(sh(&k, &id, "touch /mem/x && echo rw"), "rw");

    // On the host: secrets and the Memory emptyDir on tmpfs (the latter of
    // its sizeLimit), the configMap on disk.
    let vols = k.dir.join("root/pods").join(&uid).join("volumes");
    let sec =
        mount_at(&vols.join("kubernetes.io~secret/sec")).expect("the secret volume is a mount");
    assert_eq!(sec.0, "tmpfs");
    let proj = std::fs::read_dir(vols.join("kubernetes.io~projected"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(proj
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("kube-api-access-"));
    assert_eq!(
        mount_at(&proj).expect("the token volume is a mount").0,
        "tmpfs"
    );
    let mem = mount_at(&vols.join("kubernetes.io~empty-dir/mem")).expect("tmpfs");
    assert_eq!(mem.0, "tmpfs");
    assert!(mem.1.contains("size=16384k"), "{mem:?}");
    // Kept out of swap where the kernel allows it (6.4 on), as upstream's
    // emptyDir does for every memory-backed volume. Old code: no noswap.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release.trim().split(|c: char| !c.is_ascii_digit());
    let (major, minor): (u32, u32) = (
        v.next().unwrap().parse().unwrap(),
        v.next().unwrap().parse().unwrap(),
    );
    let noswap = (major, minor) >= (6, 4);
    for m in [&mem, &sec] {
        assert_eq!(m.1.split(',').any(|o| o == "noswap"), noswap, "{m:?}");
    }
    assert!(mount_at(&vols.join("kubernetes.io~configmap/cfg")).is_none());
    let info = mount_at(&vols.join("kubernetes.io~downward-api/info"));
    assert_eq!(info.expect("the downward API volume is a mount").0, "tmpfs");

    // An update reaches the file within the sync period; the subPath mount
    // keeps the content it was started with, as upstream.
    let mut cm = api.get("configmaps", Some("default"), "cfg").unwrap();
    cm["data"]["key"] = json!("v2");
    api.update(cm);
    wait_for("the configMap file to change in the container", T, || {
        (sh(&k, &id, "cat /cfg/key") == "v2").then_some(())
    });
    assert_eq!(sh(&k, &id, "cat /cfg-sub/key"), "v1");
    assert_eq!(sh(&k, &id, "echo $FROM_CM"), "v1", "env is fixed at start");

    // The token file is replaced before the token expires (20 s life,
    // refreshed at 80 %).
    let token2 = wait_for("a fresh token in the volume", T, || {
        let t = sh(&k, &id, &format!("cat {sa}/token"));
        (t != token1 && !t.is_empty()).then_some(t)
    });
    assert_eq!(token2.split('.').count(), 3);

    // A non-root pod with an fsGroup reads its token and a 0400 secret
    // through the group, as upstream's SetVolumeOwnership arranges.
    let fsg = format!("fsg-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": fsg, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
            "volumes": [{"name": "sec", "secret": {"secretName": "sec", "defaultMode": 256}},
                {"name": "scratch", "emptyDir": {}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "sec", "mountPath": "/sec"},
                    {"name": "scratch", "mountPath": "/scratch"}]
            }]
        }
    }));
    let p2 = running_pod(&api, &fsg);
    let id2 = container_id(&p2, 0);
    assert_eq!(
        sh(&k, &id2, "id -u; id -G | tr ' ' '\\n' | grep -x 2000"),
        "1000\n2000"
    );
    assert_eq!(sh(&k, &id2, "stat -L -c '%a %g' /sec/pw"), "440 2000");
    assert_eq!(sh(&k, &id2, "cat /sec/pw"), "s3cret");
    let t = sh(&k, &id2, &format!("cat {sa}/token"));
    assert_eq!(t.split('.').count(), 3, "the token is readable: {t:?}");
    assert_eq!(
        sh(&k, &id2, "touch /scratch/f && stat -c %g /scratch/f"),
        "2000",
        "emptyDir: set-gid directory of the fsGroup"
    );
    api.delete("pods", Some("default"), &fsg, Some(0));

    // Deleting the pod leaves no mount and no directory behind.
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the pod to be gone from the API", T, || {
        api.get("pods", Some("default"), &name)
            .is_none()
            .then_some(())
    });
    let pod_dir = k.dir.join("root/pods").join(&uid);
    wait_for("the pod directory to be removed", T, || {
        (!path_exists(&pod_dir)).then_some(())
    });
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !info.contains(&uid),
        "mounts of the pod are left: {}",
        info.lines()
            .filter(|l| l.contains(&uid))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn missing_data_waits_with_upstreams_reasons_and_persistent_volumes_mount() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-vol2";
    let k = cluster_kubelet(node, &api);

    // A Secret referenced by env that does not exist yet.
    let name = format!("later-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "later", "key": "pw"}}}]
            }]
        }
    }));
    wait_for("CreateContainerConfigError in the API", T, || {
        api.get("pods", Some("default"), &name).filter(|p| {
            let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
            w["reason"] == "CreateContainerConfigError"
                && w["message"] == "secret \"later\" not found"
        })
    });
    api.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "later", "namespace": "default"}, "data": {"pw": "eA=="}}));
    let p = running_pod(&api, &name);
    assert_eq!(sh(&k, &container_id(&p, 0), "echo $PW"), "x");

    // hostPath types: File on a missing path fails with a FailedMount
    // naming the volume; DirectoryOrCreate creates it.
    let host = k.dir.join("host");
    let made = host.join("made");
    let hp = format!("hp-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": hp, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [
                {"name": "made", "hostPath": {"path": made.to_str().unwrap(), "type": "DirectoryOrCreate"}},
                {"name": "file", "hostPath": {"path": host.join("nofile").to_str().unwrap(), "type": "File"}}
            ],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "made", "mountPath": "/made"}, {"name": "file", "mountPath": "/file"}]
            }]
        }
    }));
    failed_mount(&api, &hp, |m| {
        m.contains("MountVolume.SetUp failed for volume \"file\"") && m.contains("is not a file")
    });
    assert!(made.is_dir(), "DirectoryOrCreate made the directory");
    std::fs::write(host.join("nofile"), "f").unwrap();
    let p = running_pod(&api, &hp);
    assert_eq!(sh(&k, &container_id(&p, 0), "cat /file"), "f");

    // A claim bound to a hostPath PV.
    let pv_dir = k.dir.join("pv");
    std::fs::create_dir_all(&pv_dir).unwrap();
    std::fs::write(pv_dir.join("data"), "persistent").unwrap();
    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pv1"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": pv_dir.to_str().unwrap()},
            "claimRef": {"namespace": "default", "name": "claim", "uid": pvc["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "claim")
        .unwrap();
    bound["status"] = json!({"phase": "Bound"});
    api.update_status(bound);
    // And one bound to a local PV, which takes the pod's fsGroup (upstream's
    // local plugin) where the hostPath PV does not.
    let local_dir = k.dir.join("local-pv");
    std::fs::create_dir_all(&local_dir).unwrap();
    std::fs::write(local_dir.join("data"), "local").unwrap();
    let pvc2 = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim2", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pv2"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv2"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": local_dir.to_str().unwrap()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            "claimRef": {"namespace": "default", "name": "claim2", "uid": pvc2["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "claim2")
        .unwrap();
    bound["status"] = json!({"phase": "Bound"});
    api.update_status(bound);
    let pv = format!("pv-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pv, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "securityContext": {"fsGroup": 3000},
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "claim"}},
                {"name": "local", "persistentVolumeClaim": {"claimName": "claim2"}}
            ],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "local", "mountPath": "/local"}
                ]
            }]
        }
    }));
    let p = running_pod(&api, &pv);
    assert_eq!(sh(&k, &container_id(&p, 0), "cat /data/data"), "persistent");
    assert_eq!(sh(&k, &container_id(&p, 0), "cat /local/data"), "local");
    {
        use std::os::unix::fs::MetadataExt;
        let gid = |p: &Path| std::fs::metadata(p).unwrap().gid();
        assert_eq!(
            gid(&local_dir.join("data")),
            3000,
            "local PV: fsGroup applied"
        );
        assert_eq!(gid(&local_dir), 3000, "local PV: fsGroup applied");
        assert_eq!(gid(&pv_dir.join("data")), 0, "hostPath PV: left alone");
    }
    // Volume usage: the pod's volumes with their claims in the summary, and
    // the claims' series in /metrics.
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let (local, volumes) = wait_for("the local PV's volume stats", T, || {
        let (_, body) = http_get(&k.read_only, "/stats/summary")?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let pod = v["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["uid"] == uid.as_str())?
            .clone();
        let local = pod["volume"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "local")
            .cloned()?;
        Some((local, pod["volume"].clone()))
    });
    // The hostPath PV has no stats: upstream's hostPath plugin has none.
    assert!(
        !volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "data"),
        "{volumes:#}"
    );
    assert_eq!(
        local["pvcRef"],
        json!({"name": "claim2", "namespace": "default"})
    );
    assert!(local["usedBytes"].as_u64().unwrap() > 0, "{local}");
    assert!(local["capacityBytes"].as_u64().unwrap() >= local["availableBytes"].as_u64().unwrap());
    let metrics = wait_for("the claim's volume series", T, || {
        let (_, body) = http_get(&k.read_only, "/metrics")?;
        body.contains("kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"claim2\"}")
            .then_some(body)
    });
    assert!(
        !metrics.contains("persistentvolumeclaim=\"claim\""),
        "no series for the hostPath PV's claim"
    );
    // A generic ephemeral volume: its claim `<pod>-<volume>` is used only
    // once the pod owns it (upstream ephemeral.VolumeIsForPod), then it is
    // mounted as any claim.
    let eph = format!("eph-{node}");
    let eph_claim = format!("{eph}-scratch");
    let eph_dir = k.dir.join("eph-pv");
    std::fs::create_dir_all(&eph_dir).unwrap();
    std::fs::write(eph_dir.join("data"), "ephemeral").unwrap();
    let owner = |name: &str, uid: &str| json!([{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": true}]);
    let pvc3 = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": eph_claim, "namespace": "default",
            "ownerReferences": owner("other", "0b8a4c1e-0000-4000-8000-000000000000")},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pv3"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv3"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": eph_dir.to_str().unwrap()},
            "claimRef": {"namespace": "default", "name": eph_claim, "uid": pvc3["metadata"]["uid"]}}}));
    let bind = |api: &ApiServer| {
        let mut c = api
            .get("persistentvolumeclaims", Some("default"), &eph_claim)
            .unwrap();
        c["status"] = json!({"phase": "Bound"});
        api.update_status(c);
    };
    bind(&api);
    let p = api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": eph, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]
            }]
        }
    }));
    let not_owner =
        format!("PVC default/{eph_claim} was not created for pod default/{eph} (pod is not owner)");
    failed_mount(&api, &eph, |m| m.contains(&not_owner));
    let mut c = api
        .get("persistentvolumeclaims", Some("default"), &eph_claim)
        .unwrap();
    c["metadata"]["ownerReferences"] = owner(&eph, p["metadata"]["uid"].as_str().unwrap());
    api.update(c);
    bind(&api);
    let p = running_pod(&api, &eph);
    assert_eq!(
        sh(&k, &container_id(&p, 0), "cat /scratch/data"),
        "ephemeral"
    );

    for n in [&name, &hp, &pv, &eph] {
        api.delete("pods", Some("default"), n, Some(0));
    }
    wait_for("the pods to be gone", T, || {
        [&name, &hp, &pv, &eph]
            .iter()
            .all(|n| api.get("pods", Some("default"), n).is_none())
            .then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(pv_dir.join("data")).unwrap(),
        "persistent",
        "a persistent volume's data stays"
    );
}

/// configMapAndSecretChangeDetectionStrategy Get and Cache (upstream's
/// simple and TTL-cache managers): no watch is opened for the objects pods
/// read, each read is a GET (Cache: kept for the Node's
/// node.alpha.kubernetes.io/ttl), and volumes still follow a changed
/// ConfigMap, written again every resync period. The old code accepted the
/// field and watched anyway.
#[test]
fn get_and_cache_strategies_read_by_get_and_still_update_volumes() {
    for strategy in ["Get", "Cache"] {
        let api = ApiServer::start(ApiServerOptions::default());
        let node = format!("it-{}", strategy.to_lowercase());
        let cm = format!("cfg-{node}");
        api.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm, "namespace": "default"}, "data": {"key": "v1"}}));
        if strategy == "Cache" {
            // As the TTL controller annotates Nodes of a small cluster.
            api.create(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "annotations": {"node.alpha.kubernetes.io/ttl": "1"}}}));
        }
        let mut k = Kubelet::new(&node);
        let kc = api.node_kubeconfig(&k.dir, &node);
        k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
        k.extra_config = format!(
            "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 2s\nconfigMapAndSecretChangeDetectionStrategy: {strategy}\n"
        );
        k.spawn();
        let name = format!("data-{node}");
        api.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node, "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "cfg", "configMap": {"name": cm}}],
                "containers": [{
                    "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "exec sleep 3600"],
                    "env": [{"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": cm, "key": "key"}}}],
                    "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]
                }]
            }
        }));
        let p = running_pod(&api, &name);
        let id = container_id(&p, 0);
        assert_eq!(
            sh(&k, &id, "cat /cfg/key; echo -n :$FROM_CM"),
            "v1:v1",
            "{strategy}"
        );
        let mut c = api.get("configmaps", Some("default"), &cm).unwrap();
        c["data"]["key"] = json!("v2");
        api.update(c);
        wait_for(&format!("{strategy}: the volume updated"), T, || {
            (sh(&k, &id, "cat /cfg/key") == "v2").then_some(())
        });
        let watches = api.count_requests("GET", &format!("fieldSelector=metadata.name%3D{cm}"));
        assert_eq!(watches, 0, "{strategy}: no watch of the ConfigMap");
        assert!(
            api.count_requests("GET", &format!("/configmaps/{cm}")) >= 2,
            "{strategy}: read by GET"
        );
        api.delete("pods", Some("default"), &name, Some(0));
        wait_for("the pod gone", T, || {
            api.get("pods", Some("default"), &name)
                .is_none()
                .then_some(())
        });
        k.stop();
    }
}

/// The DER contents of every PEM block in `text`, sorted (the kubelet's
/// order is its own, fixed per process).
fn ders(text: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|p| p.expect("PEM block").contents)
        .collect();
    out.sort();
    out
}

fn ctb(name: &str, signer: &str, env: &str, bundle: &str) -> Value {
    json!({"apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
        "metadata": {"name": name, "labels": {"env": env}},
        "spec": {"signerName": signer, "trustBundle": bundle}})
}

/// clusterTrustBundle projected sources (upstream's projected plugin and
/// clustertrustbundle manager, gate ClusterTrustBundleProjection on): one
/// bundle by name, the bundles of a signer picked by labels, and all of a
/// signer's (empty selector); each file holds the selected certificates,
/// deduplicated, as CERTIFICATE blocks, and follows a bundle's update. The
/// old code refused the source ("clusterTrustBundle projections are not
/// supported yet"), so the pod never started.
#[test]
fn cluster_trust_bundles_are_projected_and_follow_updates() {
    use common::apiserver::trustbundle::ca_certificate_pem;
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-ctb";
    let (a, b, c, d) = (
        ca_certificate_pem("a"),
        ca_certificate_pem("b"),
        ca_certificate_pem("c"),
        ca_certificate_pem("d"),
    );
    let s = "example.com/s";
    api.create(ctb("example.com:s:one", s, "prod", &a));
    api.create(ctb("example.com:s:two", s, "dev", &format!("{b}{a}")));
    api.create(ctb("example.com:t:one", "example.com/t", "prod", &d));
    api.create(ctb("plain", "", "prod", &c));
    let mut k = Kubelet::new(node);
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
    k.extra_config = "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 5s\nfeatureGates:\n  ClusterTrustBundleProjection: true\n".into();
    k.spawn();
    let name = format!("ctb-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "ca", "projected": {"sources": [
                {"clusterTrustBundle": {"name": "plain", "path": "by-name.pem"}},
                {"clusterTrustBundle": {"signerName": s,
                    "labelSelector": {"matchLabels": {"env": "prod"}}, "path": "prod.pem"}},
                {"clusterTrustBundle": {"signerName": s, "labelSelector": {}, "path": "all.pem"}},
                {"clusterTrustBundle": {"name": "missing", "optional": true, "path": "none.pem"}}
            ]}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "ca", "mountPath": "/ca"}]
            }]
        }
    }));
    let p = running_pod(&api, &name);
    let id = container_id(&p, 0);
    let cat = |f: &str| sh(&k, &id, &format!("cat /ca/{f}"));
    assert_eq!(ders(&cat("by-name.pem")), ders(&c));
    assert_eq!(ders(&cat("prod.pem")), ders(&a));
    // Two bundles of the signer, `a` in both: once. Not the other signer's.
    assert_eq!(ders(&cat("all.pem")), ders(&format!("{a}{b}")));
    assert_eq!(cat("none.pem"), "", "optional and missing: an empty file");
    // Only the blocks, in Go's encoding (64 columns, \n line ends).
    let all = cat("all.pem");
    assert_eq!(all.matches("-----BEGIN CERTIFICATE-----\n").count(), 2);
    assert!(!all.contains('\r'));
    assert!(all.lines().all(|l| l.len() <= 64), "{all}");

    // An update of a selected bundle reaches the file; a bundle of the
    // signer newly labelled prod joins the selection.
    let mut one = api
        .get("clustertrustbundles", None, "example.com:s:one")
        .unwrap();
    one["spec"]["trustBundle"] = json!(format!("{a}{d}"));
    api.update(one);
    wait_for("prod.pem to follow the updated bundle", T, || {
        (ders(&cat("prod.pem")) == ders(&format!("{a}{d}"))).then_some(())
    });
    let mut two = api
        .get("clustertrustbundles", None, "example.com:s:two")
        .unwrap();
    two["metadata"]["labels"]["env"] = json!("prod");
    api.update(two);
    wait_for("prod.pem to take in the relabelled bundle", T, || {
        (ders(&cat("prod.pem")) == ders(&format!("{a}{b}{d}"))).then_some(())
    });
    // One watch of all bundles, found by discovery at v1beta1.
    assert!(api.count_requests("GET", "/apis/certificates.k8s.io/v1beta1") >= 1);
    assert!(api.count_requests("GET", "clustertrustbundles?") >= 1);

    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the pod gone", T, || {
        api.get("pods", Some("default"), &name)
            .is_none()
            .then_some(())
    });
    k.stop();
}

/// ClusterTrustBundleProjection is off by default in 1.34: upstream's
/// kubelet then uses its no-op manager, and the volume fails with its
/// words (a FailedMount per attempt), the pod waiting for it. No
/// ClusterTrustBundle is asked for.
#[test]
fn without_the_feature_gate_a_trust_bundle_source_fails_as_upstream() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-ctb-off";
    let k = cluster_kubelet(node, &api);
    let name = format!("ctb-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "ca", "projected": {"sources": [
                {"clusterTrustBundle": {"name": "any", "optional": true, "path": "ca.pem"}}]}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "ca", "mountPath": "/ca"}]
            }]
        }
    }));
    wait_for("a FailedMount event for the trust bundle volume", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == name.as_str()
                && e["message"]
                    == "MountVolume.SetUp failed for volume \"ca\" : ClusterTrustBundle projection is not supported in static kubelet mode"
        })
    });
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_ne!(p["status"]["phase"], "Running");
    assert_eq!(api.count_requests("GET", "clustertrustbundles"), 0);
    assert_eq!(
        api.count_requests("GET", "/apis/certificates.k8s.io/v1beta1"),
        0
    );
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the pod gone", T, || {
        api.get("pods", Some("default"), &name)
            .is_none()
            .then_some(())
    });
    drop(k);
}

/// A claim bound to a local PV with `volumeMode: Block` (a loop device):
/// the container gets the device at its `volumeDevices` path (upstream's
/// MapVolume: a bind of the device per pod under the plugin's global map
/// path, a link in the pod's volumeDevices directory, handed to CRI as a
/// device), reads what the host wrote and writes what the host then finds
/// in the backing file; a pod naming the claim in `volumeMounts` fails as
/// upstream's populator does; the device's size is the volume's capacity
/// in `/stats/summary` and the claim's `kubelet_volume_stats_capacity_bytes`
/// (metrics_block.go; used and inodes zero); nothing is left once the pod
/// is gone. The old code treated the device as a directory and never
/// started the pod, and then left block volumes out of the stats.
#[test]
fn a_block_claim_on_a_local_pv_is_a_device_in_the_container_and_goes_with_the_pod() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-vol-blk";
    let k = cluster_kubelet(node, &api);
    let backing = k.dir.join("disk.img");
    let dev = marked_loop_disk(&backing);

    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "blk", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
            "resources": {"requests": {"storage": "16Mi"}}, "volumeName": "pv-blk"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-blk"},
        "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block", "local": {"path": dev.0},
            "claimRef": {"namespace": "default", "name": "blk", "uid": pvc["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "blk")
        .unwrap();
    bound["status"] = json!({"phase": "Bound"});
    api.update_status(bound);

    // Named in volumeMounts: upstream's populator refuses the volume.
    let wrong = format!("blk-mount-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": wrong, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": "blk"}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "disk", "mountPath": "/disk"}]
            }]
        }
    }));
    wait_for(
        "upstream's FailedMount for a Block volume in volumeMounts",
        T,
        || {
            api.list("events").into_iter().find(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == wrong.as_str()
                && e["message"].as_str().is_some_and(|m| {
                    m.starts_with("Unable to attach or mount volumes: unmounted volumes=[")
                        && m.ends_with(
                            "failed to process volumes=[disk]: volume disk has volumeMode Block, but is specified in volumeMounts",
                        )
                })
        })
        },
    );
    api.delete("pods", Some("default"), &wrong, Some(0));

    let name = format!("blk-{node}");
    api.create(block_pod(&name, node, "blk"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let id = container_id(&p, 0);
    device_is_shared_with_the_host(&k, &id, &backing, T);
    let root = k.dir.join("root");
    let global = root.join("plugins/kubernetes.io~local-volume/volumeDevices/pv-blk");
    let link = root
        .join("pods")
        .join(&uid)
        .join("volumeDevices/kubernetes.io~local-volume/pv-blk");
    assert_eq!(
        std::fs::read_link(&link).unwrap().to_str(),
        Some(dev.0.as_str()),
        "the pod's device link names the PV's device"
    );
    assert_eq!(
        mounts_containing(global.to_str().unwrap()),
        vec![global.join(&uid).display().to_string()],
        "one bind of the device for the pod"
    );
    // Timed under upstream's operation names for a raw block volume
    // (GenerateMapVolumeFunc / GenerateUnmapVolumeFunc), not as mounts.
    let timed = |op: &str| {
        let want = format!(
            "storage_operation_duration_seconds_count{{migrated=\"false\",operation_name=\"{op}\",status=\"success\",volume_plugin=\"kubernetes.io/local-volume\"}} "
        );
        http_get(&k.read_only, "/metrics")
            .is_some_and(|(_, body)| body.lines().any(|l| l.starts_with(&want)))
    };
    assert!(timed("map_volume"), "map_volume timed");
    assert!(!timed("volume_mount"), "a mapped device is no mount");
    let vol = summary_volume(&k, &uid, "disk", T);
    assert_eq!(vol["capacityBytes"], 16u64 << 20, "{vol}");
    assert_eq!(vol["usedBytes"], 0);
    assert_eq!(vol["availableBytes"], 0);
    assert_eq!(vol["inodes"], 0);
    assert_eq!(
        vol["pvcRef"],
        json!({"name": "blk", "namespace": "default"})
    );
    let (_, metrics) = http_get(&k.read_only, "/metrics").expect("/metrics");
    assert!(
        metrics.lines().any(|l| l
            == "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"blk\"} 16777216"),
        "{metrics}"
    );

    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the pod to be gone", T, || {
        api.get("pods", Some("default"), &name)
            .is_none()
            .then_some(())
    });
    wait_for("the device unmapped", T, || {
        (mounts_containing(root.to_str().unwrap())
            .iter()
            .all(|m| !m.contains("volumeDevices"))
            && std::fs::symlink_metadata(&link).is_err()
            && !global.exists())
        .then_some(())
    });
    wait_for("unmap_volume and unmap_device timed", T, || {
        (timed("unmap_volume") && timed("unmap_device")).then_some(())
    });
    drop(dev);
}
