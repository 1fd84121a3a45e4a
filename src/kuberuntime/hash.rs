//! Which container spec changes restart a container. Upstream hashes a chosen
//! set of fields with FNV-32a, and every kubelet upgrade that changed that set
//! restarted all containers on the node (k/k #63814, #124220). rkubelet hashes
//! a canonical JSON of the fields that need a new container, and records the
//! field-set version beside the hash: a container whose version differs is
//! compared by nothing and kept.
//!
//! Upstream's own hash (v1.31+) is written too, under upstream's key, so a
//! node can move between the upstream kubelet and rkubelet in either
//! direction without restarting containers.

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

/// Upstream's HashContainer (v1.31 to v1.34), formatted as its
/// `io.kubernetes.container.hash` annotation: FNV-32a over go-spew's `%#v`
/// rendering of the JSON of `{"image", "name"}` (a Go `[]byte`, printed as
/// `([]uint8)[` decimal bytes `]`), in hex without leading zeros.
pub fn upstream_hash(c: &Container) -> String {
    let fields = json!({ "image": c.image.as_deref().unwrap_or_default(), "name": c.name });
    let json = go_json(&serde_json::to_string(&fields).unwrap_or_default());
    let bytes: Vec<String> = json.bytes().map(|b| b.to_string()).collect();
    let spew = format!("([]uint8)[{}]", bytes.join(" "));
    format!("{:x}", fnv32a(spew.as_bytes()))
}

/// Go's encoding/json escapes what serde_json leaves alone: the HTML
/// characters and the two JavaScript line separators. They only occur
/// inside strings, so replacing them in the encoded text is safe.
fn go_json(s: &str) -> String {
    s.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// The hashes a running container carries (see `labels`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Recorded<'a> {
    /// rkubelet's field-set hash and its version.
    pub own: Option<&'a str>,
    pub version: Option<&'a str>,
    /// Upstream's hash, under `io.kubernetes.container.hash`.
    pub upstream: Option<&'a str>,
}

/// Whether a running container must be replaced for `spec`. rkubelet's own
/// hash decides when present; a container created under another field-set
/// version is kept. A container the upstream kubelet created carries only
/// upstream's hash, and is compared the way upstream compares it, so taking
/// over a node restarts nothing that upstream would keep.
pub fn spec_changed(spec: &Container, rec: Recorded<'_>) -> bool {
    match rec {
        Recorded {
            own: Some(h),
            version: Some(v),
            ..
        } => v == SPEC_VERSION.to_string() && h != container_hash(spec),
        Recorded { own: Some(_), .. } => false,
        Recorded {
            upstream: Some(u), ..
        } => {
            // Upstream parses the annotation as hex; so does this, so a
            // value written with leading zeros still compares equal.
            let want = u64::from_str_radix(&upstream_hash(spec), 16).ok();
            u64::from_str_radix(u, 16).ok() != want
        }
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

    fn ours<'a>(h: &'a str, v: Option<&'a str>) -> Recorded<'a> {
        Recorded {
            own: Some(h),
            version: v,
            upstream: None,
        }
    }

    fn theirs(h: &str) -> Recorded<'_> {
        Recorded {
            upstream: Some(h),
            ..Default::default()
        }
    }

    #[test]
    fn image_change_is_a_spec_change_but_resources_are_not() {
        let a = ctr("busybox:1.36");
        let h = container_hash(&a);
        assert!(!spec_changed(&a, ours(&h, Some("1"))));
        assert!(spec_changed(&ctr("busybox:1.37"), ours(&h, Some("1"))));
        let mut with_res = a.clone();
        with_res.resources = Some(Default::default());
        assert!(!spec_changed(&with_res, ours(&h, Some("1"))));
    }

    #[test]
    fn containers_from_another_field_set_are_kept() {
        let a = ctr("busybox:1.36");
        assert!(!spec_changed(&a, ours("deadbeef", Some("0"))));
        assert!(!spec_changed(&a, ours("deadbeef", None)));
    }

    /// Upstream's own test vector (pkg/kubelet/container/helpers_test.go,
    /// TestHashContainer, v1.31+): only name and image count, so args and
    /// ports do not change it.
    #[test]
    fn upstream_hash_matches_upstreams_test_vector() {
        let mut c = ctr("foo/image:v1");
        c.name = "test_container".into();
        c.args = Some(vec!["/bin/sh".into(), "-c".into(), "echo abc".into()]);
        assert_eq!(upstream_hash(&c), "8e45cbd0");
    }

    /// Derived by hand from upstream's algorithm: FNV-32a of
    /// `([]uint8)[123 34 105 ...]`, the spew rendering of
    /// `{"image":"busybox:1.36","name":"app"}`, is 0x00395745, which
    /// strconv.FormatUint(h, 16) writes without leading zeros.
    #[test]
    fn upstream_hash_is_hex_without_leading_zeros() {
        assert_eq!(upstream_hash(&ctr("busybox:1.36")), "395745");
    }

    #[test]
    fn go_json_escapes_html_characters_as_go_does() {
        assert_eq!(
            go_json(r#"{"image":"a<b>&"}"#),
            r#"{"image":"a\u003cb\u003e\u0026"}"#
        );
    }

    /// Old behaviour: a container with only upstream's hash (one the upstream
    /// kubelet created) was never compared, so an image change was ignored.
    #[test]
    fn a_container_from_upstream_is_compared_by_upstreams_hash() {
        let a = ctr("busybox:1.36");
        assert!(!spec_changed(&a, theirs("395745")));
        assert!(!spec_changed(&a, theirs("00395745")));
        assert!(spec_changed(&ctr("busybox:1.37"), theirs("395745")));
        // Upstream ignores everything but name and image.
        let mut with_args = a.clone();
        with_args.args = Some(vec!["sleep".into()]);
        assert!(!spec_changed(&with_args, theirs("395745")));
    }

    #[test]
    fn rkubelets_own_hash_wins_over_upstreams() {
        let a = ctr("busybox:1.36");
        let own = container_hash(&a);
        let rec = Recorded {
            own: Some(&own),
            version: Some("1"),
            upstream: Some("bogus"),
        };
        assert!(!spec_changed(&a, rec));
    }
}
