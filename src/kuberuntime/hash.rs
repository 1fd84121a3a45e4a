//! Which container spec changes restart a container. Upstream hashes a chosen
//! set of fields with FNV-32a, and every kubelet upgrade that changed that set
//! restarted all containers on the node (k/k #63814, #124220). rkubelet hashes
//! a canonical JSON of the fields that need a new container, and records the
//! field-set version beside the hash: a container whose version differs is
//! compared by nothing and kept.

use k8s_openapi::api::core::v1::Container;
use serde_json::{json, Value};

/// Bump only together with a rule that maps older hashes forward.
pub const SPEC_VERSION: u32 = 1;

/// The fields whose change needs a new container. Resources are left out:
/// upstream stopped restarting on resource changes (in-place resize).
fn restart_fields(c: &Container) -> Value {
    // json! serializes each field with serde, the same encoding the API uses.
    json!({
        "name": c.name,
        "image": c.image,
        "command": c.command,
        "args": c.args,
        "workingDir": c.working_dir,
        "ports": c.ports,
        "env": c.env,
        "envFrom": c.env_from,
        "volumeMounts": c.volume_mounts,
        "volumeDevices": c.volume_devices,
        "securityContext": c.security_context,
        "stdin": c.stdin,
        "stdinOnce": c.stdin_once,
        "tty": c.tty,
        "lifecycle": c.lifecycle,
        "restartPolicy": c.restart_policy,
    })
}

/// FNV-1a, 32 bit, as upstream uses for the container hash label.
fn fnv32a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The value for the `io.kubernetes.container.hash` annotation.
pub fn container_hash(c: &Container) -> String {
    // serde_json maps keep keys sorted, so the encoding is canonical.
    let canonical = serde_json::to_vec(&restart_fields(c)).unwrap_or_default();
    format!("{:x}", fnv32a(&canonical))
}

/// Whether a running container must be replaced for `spec`. A container
/// created under another field-set version (or by another kubelet) is kept.
pub fn spec_changed(spec: &Container, hash: Option<&str>, version: Option<&str>) -> bool {
    match (hash, version) {
        (Some(h), Some(v)) if v == SPEC_VERSION.to_string() => h != container_hash(spec),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(image: &str) -> Container {
        Container {
            name: "app".into(),
            image: Some(image.into()),
            ..Default::default()
        }
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv32a(b""), 0x811c9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c292c);
        assert_eq!(fnv32a(b"foobar"), 0xbf9cf968);
    }

    #[test]
    fn image_change_is_a_spec_change_but_resources_are_not() {
        let a = ctr("busybox:1.36");
        let h = container_hash(&a);
        assert!(!spec_changed(&a, Some(&h), Some("1")));
        assert!(spec_changed(&ctr("busybox:1.37"), Some(&h), Some("1")));
        let mut with_res = a.clone();
        with_res.resources = Some(Default::default());
        assert!(!spec_changed(&with_res, Some(&h), Some("1")));
    }

    #[test]
    fn containers_from_another_field_set_are_kept() {
        let a = ctr("busybox:1.36");
        assert!(!spec_changed(&a, Some("deadbeef"), Some("0")));
        assert!(!spec_changed(&a, Some("deadbeef"), None));
    }
}
