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
