//! Taking over a node from the upstream kubelet: a sandbox and a container
//! created with the labels and annotations upstream v1.31+ writes (for the
//! uid-less static pod whose manifest is in rkubelet's manifest dir, under
//! upstream's UID) are adopted as they are: same UID, same container, still
//! running, restart count unchanged, over several syncs.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use rkubelet::cri::v1::{
    ContainerConfig, ContainerMetadata, ImageSpec, LinuxContainerConfig, LinuxPodSandboxConfig,
    PodSandboxConfig, PodSandboxMetadata,
};
use rkubelet::cri::{ImageService, RuntimeService};

const T: Duration = Duration::from_secs(90);

/// Upstream's `io.kubernetes.container.hash` for a container named "main"
/// with image BUSYBOX, derived by hand from upstream's HashContainer:
/// FNV-32a of go-spew's `%#v` of the JSON bytes of
/// `{"image":"docker.io/library/busybox:1.36","name":"main"}`, in hex.
const UPSTREAM_HASH: &str = "e3b3a006";

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn containers_the_upstream_kubelet_created_are_adopted_without_restart() {
    let mut k = Kubelet::start("it-takeover");
    // The node as upstream left it: rkubelet is not running yet.
    k.stop();

    // kubeadm's manifests carry no metadata.uid: upstream names the pod by
    // a hash rkubelet cannot reproduce (go-spew's dump of the Go struct), so
    // the running pod's UID is not the one rkubelet would compute. The
    // manifest was there before the pod started, as on a real node.
    let manifest = simple_pod("takeover", "exec sleep 3600", "Always");
    k.write_manifest("takeover.yaml", &manifest);
    let path = k.manifests.join("takeover.yaml");
    let decoded =
        rkubelet::source::static_pod::decode_static_pod(manifest.as_bytes(), &path, &k.node)
            .unwrap();
    let own_uid = decoded.metadata.uid.clone().unwrap();
    let uid = "6f1e3a0c2b9d4e8f7a6b5c4d3e2f1a0b".to_string();
    assert_ne!(uid, own_uid);
    let name = decoded.metadata.name.clone().unwrap();
    let ns = "default";
    let mut pod_annotations = decoded.metadata.annotations.clone().unwrap_or_default();
    pod_annotations.insert("kubernetes.io/config.hash".into(), uid.clone());
    let logs = k.dir.join("pod-logs");
    std::fs::create_dir_all(&logs).unwrap();

    let cri = &k.cri;
    let sandbox = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: ns.into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: logs.display().to_string(),
        // Upstream labels.go newPodLabels / newPodAnnotations.
        labels: map(&[
            ("io.kubernetes.pod.name", &name),
            ("io.kubernetes.pod.namespace", ns),
            ("io.kubernetes.pod.uid", &uid),
        ]),
        annotations: pod_annotations.into_iter().collect(),
        linux: Some(LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    // The image is already on the node (scripts/setup.sh); upstream passes
    // the image ID, with the user's reference beside it.
    let image_ref = cri
        .rt
        .block_on(cri.client.image_status(BUSYBOX))
        .unwrap()
        .expect("busybox present on the node")
        .id;
    let container = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image_ref,
            user_specified_image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), "exec sleep 3600".into()],
        log_path: "main/0.log".into(),
        // Upstream labels.go newContainerLabels / newContainerAnnotations.
        labels: map(&[
            ("io.kubernetes.pod.name", &name),
            ("io.kubernetes.pod.namespace", ns),
            ("io.kubernetes.pod.uid", &uid),
            ("io.kubernetes.container.name", "main"),
        ]),
        annotations: map(&[
            ("io.kubernetes.container.hash", UPSTREAM_HASH),
            ("io.kubernetes.container.restartCount", "0"),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log",
            ),
            ("io.kubernetes.container.terminationMessagePolicy", "File"),
            ("io.kubernetes.pod.terminationGracePeriod", "2"),
        ]),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    };
    let id = cri.rt.block_on(async {
        let sb = cri
            .client
            .run_pod_sandbox(sandbox.clone(), String::new())
            .await
            .unwrap();
        let id = cri
            .client
            .create_container(&sb, container, sandbox)
            .await
            .unwrap();
        cri.client.start_container(&id).await.unwrap();
        id
    });
    assert_eq!(cri.count_for_uid(&uid), (1, 1));

    // rkubelet takes over, resyncing every second.
    k.extra_config = "syncFrequency: 1s\n".into();
    k.spawn();

    let cid = format!("containerd://{id}");
    let adopted = |p: &serde_json::Value| {
        running(p, "main")
            && container_status(p, "main")
                .is_some_and(|c| c["containerID"] == cid.as_str() && c["restartCount"] == 0)
    };
    let p = k.wait_pod("takeover", "running the adopted container", T, adopted);
    assert_eq!(p["metadata"]["uid"], uid.as_str());

    // Several syncs of this pod computed their actions over the adopted
    // container; none replaced it.
    let syncs = |log: &str| {
        log.lines()
            .filter(|l| l.contains("computed pod actions") && l.contains(&name))
            .count()
    };
    wait_for("five syncs of the pod", T, || {
        (syncs(&k.log()) >= 5).then_some(())
    });
    let p = k.pod("takeover").expect("pod listed");
    assert!(adopted(&p), "container replaced or restarted: {p:#}");
    assert_eq!(phase(&p), "Running");
    assert_eq!(
        k.cri.count_for_uid(&uid),
        (1, 1),
        "no new sandbox or container"
    );
    let log = k.log();
    assert!(!log.contains("definition changed"), "{log}");
}
