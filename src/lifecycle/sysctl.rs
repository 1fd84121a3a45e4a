//! The sysctl admit handler (upstream `pkg/kubelet/sysctl`): a pod may set
//! only the safe sysctls (namespaced, isolated from other pods; some need a
//! recent enough kernel) and those `allowedUnsafeSysctls` names or matches
//! with a trailing `*`, and never a network or IPC sysctl while it shares
//! that namespace with the host. Others are refused with reason
//! `SysctlForbidden`, before anything runs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::Rejection;

/// Upstream's ForbiddenReason.
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// The safe sysctls with the kernel version each became namespaced in
/// (upstream safe_sysctls.go and pkg/util/kernel's constants).
const SAFE: &[(&str, Option<(u32, u32)>)] = &[
    ("kernel.shm_rmid_forced", None),
    ("net.ipv4.ip_local_port_range", None),
    ("net.ipv4.tcp_syncookies", None),
    ("net.ipv4.ping_group_range", None),
    ("net.ipv4.ip_unprivileged_port_start", None),
    ("net.ipv4.ip_local_reserved_ports", Some((3, 16))),
    ("net.ipv4.tcp_keepalive_time", Some((4, 5))),
    ("net.ipv4.tcp_fin_timeout", Some((4, 6))),
    ("net.ipv4.tcp_keepalive_intvl", Some((4, 5))),
    ("net.ipv4.tcp_keepalive_probes", Some((4, 5))),
    ("net.ipv4.tcp_rmem", Some((4, 15))),
    ("net.ipv4.tcp_wmem", Some((4, 15))),
];

/// The kernel namespace a sysctl lives in (component-helpers' sysctl
/// namespace table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Namespace {
    Ipc,
    Net,
}

impl Namespace {
    /// As upstream's Namespace strings print.
    fn as_str(self) -> &'static str {
        match self {
            Namespace::Ipc => "IPC",
            Namespace::Net => "Net",
        }
    }

    fn of(name: &str) -> Option<Namespace> {
        const IPC: &[&str] = &[
            "kernel.sem",
            "kernel.shmall",
            "kernel.shmmax",
            "kernel.shmmni",
            "kernel.shm_rmid_forced",
            "kernel.shm",
            "kernel.msgmax",
            "kernel.msgmnb",
            "kernel.msgmni",
            "kernel.msg",
        ];
        if IPC.contains(&name) {
            return Some(Namespace::Ipc);
        }
        if name.starts_with("net.") {
            return Some(Namespace::Net);
        }
        if name.starts_with("fs.mqueue.") {
            return Some(Namespace::Ipc);
        }
        None
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SysctlError {
    #[error("sysctl {0:?} must have at most 253 characters and match regex ([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]")]
    Invalid(String),
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
}

/// Upstream's patternAllowlist: exact names, and prefixes from patterns
/// ending in `*`.
#[derive(Clone, Debug, Default)]
pub struct Allowlist {
    sysctls: BTreeMap<String, Namespace>,
    prefixes: BTreeMap<String, Namespace>,
}

impl Allowlist {
    /// The safe sysctls this kernel namespaces, with the unsafe ones the
    /// configuration allows (upstream NewMainKubelet).
    pub fn for_node(kernel_release: &str, allowed_unsafe: &[String]) -> Result<Self, SysctlError> {
        let mut patterns: Vec<String> = safe_sysctls(kernel_release)
            .into_iter()
            .map(String::from)
            .collect();
        patterns.extend(allowed_unsafe.iter().cloned());
        Self::new(&patterns)
    }

    /// Upstream NewAllowlist.
    pub fn new(patterns: &[String]) -> Result<Self, SysctlError> {
        let mut w = Allowlist::default();
        for p in patterns {
            if !valid_pattern(p) {
                return Err(SysctlError::Invalid(p.clone()));
            }
            let name = normalize_name(p);
            let (name, prefixed) = match name.find('*') {
                Some(i) => (name[..i].to_string(), true),
                None => (name, false),
            };
            let Some(ns) = Namespace::of(&name) else {
                return Err(SysctlError::NotNamespaced(name));
            };
            if prefixed {
                w.prefixes.insert(name, ns);
            } else {
                w.sysctls.insert(name, ns);
            }
        }
        Ok(w)
    }

    /// Upstream validateSysctl.
    fn validate(&self, sysctl: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let sysctl = normalize_name(sysctl);
        let ns = self.sysctls.get(&sysctl).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| sysctl.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            None => Err(format!("{sysctl:?} not allowlisted")),
            Some(ns @ Namespace::Ipc) if host_ipc => Err(format!(
                "{sysctl:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Some(ns @ Namespace::Net) if host_net => Err(format!(
                "{sysctl:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Some(_) => Ok(()),
        }
    }

    /// Upstream's Admit: the first sysctl refused decides.
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|sc| sc.sysctls.as_deref())
            .unwrap_or_default();
        let (host_net, host_ipc) = (
            spec.host_network.unwrap_or(false),
            spec.host_ipc.unwrap_or(false),
        );
        for s in sysctls {
            if let Err(e) = self.validate(&s.name, host_net, host_ipc) {
                return Err(Rejection {
                    reason: FORBIDDEN_REASON.into(),
                    message: format!("forbidden sysctl: {e}"),
                });
            }
        }
        Ok(())
    }
}

/// The safe sysctls for a kernel release ("6.1.0-18-amd64"); those needing
/// a newer kernel than it, or all of those when it does not parse, are
/// left out, as upstream's getSafeSysctlAllowlist does.
pub fn safe_sysctls(kernel_release: &str) -> Vec<&'static str> {
    let version = kernel_version(kernel_release);
    SAFE.iter()
        .filter(|(_, min)| match (min, version) {
            (None, _) => true,
            (Some(min), Some(v)) => v >= *min,
            (Some(_), None) => false,
        })
        .map(|(name, _)| *name)
        .collect()
}

/// Major and minor of a kernel release string.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A sysctl written with slashes ("net/ipv4/conf/eno2.100/rp_filter") in
/// the dotted form ("net.ipv4.conf.eno2/100.rp_filter"): the two swap when
/// the first separator is a slash (upstream NormalizeName).
pub fn normalize_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// Upstream IsValidSysctlPattern: at most 253 characters, matching
/// `([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]`.
/// Written out because it is one fixed pattern and the project has no
/// regex engine.
fn valid_pattern(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let inner = |c: char| alnum(c) || c == '-' || c == '_';
    let segments: Vec<&str> = name.split(['.', '/']).collect();
    let (last, leading) = segments.split_last().expect("split yields one part");
    // Each leading segment: alphanumeric at both ends, `-` and `_` inside.
    let leading_ok = leading.iter().all(|s| {
        let mut cs = s.chars();
        match (cs.next(), s.chars().last()) {
            (Some(first), Some(end)) => alnum(first) && alnum(end) && s.chars().all(inner),
            _ => false,
        }
    });
    // The last: optional `[a-z0-9][-_a-z0-9]*`, then one `[a-z0-9*]`.
    let last_ok = match last.char_indices().last() {
        Some((i, end)) => {
            let head = &last[..i];
            (alnum(end) || end == '*')
                && (head.is_empty() || (head.starts_with(alnum) && head.chars().all(inner)))
        }
        None => false,
    };
    leading_ok && last_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(sysctls: &[&str], host_net: bool, host_ipc: bool) -> Pod {
        let s: Vec<_> = sysctls
            .iter()
            .map(|n| json!({"name": n, "value": "1"}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "hostNetwork": host_net,
                "hostIPC": host_ipc,
                "securityContext": {"sysctls": s},
                "containers": [{"name": "c", "image": "busybox"}]
            }
        }))
        .unwrap()
    }

    fn list(unsafe_: &[&str]) -> Allowlist {
        let u: Vec<String> = unsafe_.iter().map(|s| s.to_string()).collect();
        Allowlist::for_node("6.1.0-18-amd64", &u).unwrap()
    }

    #[test]
    fn safe_sysctls_follow_the_kernel_version() {
        assert_eq!(safe_sysctls("6.18.44-fc-v782").len(), 12);
        let old = safe_sysctls("4.9.0");
        assert!(old.contains(&"net.ipv4.tcp_fin_timeout"));
        assert!(!old.contains(&"net.ipv4.tcp_rmem"));
        assert_eq!(safe_sysctls("3.10.0-1160.el7.x86_64").len(), 5);
        // Unparsable: only those with no minimum.
        assert_eq!(safe_sysctls("").len(), 5);
    }

    #[test]
    fn unsafe_sysctls_are_refused_unless_allowed_as_upstream() {
        let safe = list(&[]);
        assert_eq!(
            safe.admit(&pod(&["net.ipv4.tcp_syncookies"], false, false)),
            Ok(())
        );
        assert_eq!(
            safe.admit(&pod(
                &["net.ipv4.tcp_syncookies", "kernel.msgmax"],
                false,
                false
            )),
            Err(Rejection {
                reason: "SysctlForbidden".into(),
                message: "forbidden sysctl: \"kernel.msgmax\" not allowlisted".into()
            })
        );
        let allowed = list(&["kernel.msg*", "net.core.somaxconn"]);
        assert_eq!(
            allowed.admit(&pod(&["kernel.msgmax"], false, false)),
            Ok(())
        );
        assert_eq!(
            allowed.admit(&pod(&["net.core.somaxconn"], false, false)),
            Ok(())
        );
        // Slashes read as dots.
        assert_eq!(
            allowed.admit(&pod(&["net/core/somaxconn"], false, false)),
            Ok(())
        );
        assert!(allowed.admit(&pod(&["kernel.sem"], false, false)).is_err());
    }

    #[test]
    fn a_pod_sharing_the_hosts_namespace_may_not_set_its_sysctls() {
        let w = list(&["kernel.shm*"]);
        let r = w.admit(&pod(&["net.ipv4.ip_local_port_range"], true, false));
        assert_eq!(
            r.unwrap_err().message,
            "forbidden sysctl: \"net.ipv4.ip_local_port_range\" not allowed with host Net enabled"
        );
        let r = w.admit(&pod(&["kernel.shmmax"], false, true));
        assert_eq!(
            r.unwrap_err().message,
            "forbidden sysctl: \"kernel.shmmax\" not allowed with host IPC enabled"
        );
        assert_eq!(w.admit(&pod(&["kernel.shmmax"], true, false)), Ok(()));
    }

    #[test]
    fn allowed_unsafe_sysctls_must_be_namespaced_and_well_formed() {
        let e = Allowlist::new(&["kernel.panic".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the sysctls \"kernel.panic\" are not known to be namespaced"
        );
        assert_eq!(
            Allowlist::new(&["vm.*".into()]).unwrap_err(),
            SysctlError::NotNamespaced("vm.".into())
        );
        assert!(matches!(
            Allowlist::new(&["Net.core.x".into()]),
            Err(SysctlError::Invalid(_))
        ));
        for ok in [
            "net.*",
            "net.ipv4.conf.eno2/100.rp_filter",
            "fs.mqueue.*",
            "kernel.shm_rmid_forced",
        ] {
            assert!(valid_pattern(ok), "{ok}");
        }
        for bad in [
            "", "net.", ".net", "net..x", "net.-x", "net.x-", "a*b.c", "net.*x",
        ] {
            assert!(!valid_pattern(bad), "{bad}");
        }
        assert!(!valid_pattern(&format!("net.{}", "a".repeat(250))));
    }

    #[test]
    fn names_with_slashes_swap_to_dots_as_upstream() {
        assert_eq!(
            normalize_name("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(
            normalize_name("net.ipv4.conf.eno2/100.rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(normalize_name("kernel.msgmax"), "kernel.msgmax");
    }
}
