//! Fixtures shared by unit tests across modules.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// A pod with the given restart policy and busybox init and app containers.
pub fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
    let c = |n: &&str| Container {
        name: n.to_string(),
        image: Some("busybox:1.36".into()),
        ..Default::default()
    };
    Pod {
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: Some(inits.iter().map(c).collect()),
            containers: apps.iter().map(c).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An `Always` pod with one app container `app`, named `name` in
/// `default`, with `uid`.
pub fn named_pod(name: &str, uid: &str) -> Pod {
    let mut p = pod("Always", &[], &["app"]);
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p
}

/// The Unix epoch as an API time (a deletionTimestamp, say).
pub fn epoch() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// A runtime manager over the fake runtime, in a fresh temporary root.
pub fn runtime_manager(
    fake: &std::sync::Arc<crate::cri::fake::FakeRuntime>,
) -> std::sync::Arc<crate::kuberuntime::RuntimeManager> {
    use crate::kuberuntime::{RuntimeManager, RuntimeOptions};
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let root = std::env::temp_dir().join(format!(
        "rkubelet-rm-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let opts = RuntimeOptions {
        root_dir: root.clone(),
        pod_logs_dir: root.join("logs"),
        container_logs_dir: root.join("containers"),
        resolv_conf: std::path::PathBuf::new(),
        ..RuntimeOptions::default()
    };
    std::sync::Arc::new(RuntimeManager::new(
        fake.clone(),
        crate::images::ImageManager::new(fake.clone(), true, None),
        opts,
    ))
}

/// A configuration from the config file's fields in `yaml` (the header
/// added), as a file would load.
pub fn kubelet_config(yaml: &str) -> crate::config::KubeletConfiguration {
    crate::config::KubeletConfiguration::load_str(&format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}"
    ))
    .expect("config")
    .0
}

/// A fresh, empty directory for one test: `rkubelet-<tag>-<pid>` under the
/// system temp dir (emptied first, in case an earlier run left it).
pub fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rkubelet-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A kubeconfig in `dir` for a plain-HTTP test server at `addr`, with no
/// credentials.
pub fn plain_http_kubeconfig(
    dir: &std::path::Path,
    addr: std::net::SocketAddr,
) -> std::path::PathBuf {
    let kc = dir.join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    kc
}
