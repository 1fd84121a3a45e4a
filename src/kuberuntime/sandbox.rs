//! PodSandboxConfig from a pod (upstream `kuberuntime_sandbox.go`
//! generatePodSandboxConfig) and the pod's DNS settings (`pkg/kubelet/network/dns`).

use k8s_openapi::api::core::v1::Pod;

use crate::cri::v1::{self, NamespaceMode};

use super::labels;
use super::RuntimeOptions;

/// Upstream `kubecontainer.GetPodFullName`-style log dir: `<ns>_<name>_<uid>`.
pub fn pod_log_dir(opts: &RuntimeOptions, pod: &Pod) -> String {
    let m = &pod.metadata;
    format!(
        "{}/{}_{}_{}",
        opts.pod_logs_dir.display(),
        m.namespace.as_deref().unwrap_or("default"),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

pub fn namespace_options(pod: &Pod) -> v1::NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| {
        spec.and_then(f).unwrap_or(false)
    };
    let mode = |host: bool, otherwise: NamespaceMode| if host { NamespaceMode::Node } else { otherwise } as i32;
    v1::NamespaceOption {
        network: mode(flag(|s| s.host_network), NamespaceMode::Pod),
        pid: mode(
            flag(|s| s.host_pid),
            if flag(|s| s.share_process_namespace) {
                NamespaceMode::Pod
            } else {
                NamespaceMode::Container
            },
        ),
        ipc: mode(flag(|s| s.host_ipc), NamespaceMode::Pod),
        // Upstream (UserNamespacesSupport, beta and on in 1.34) names the
        // node's user namespace outright for a pod that asks for no other;
        // `hostUsers: false` never gets this far (`user_namespace_refusal`).
        userns_options: Some(v1::UserNamespace {
            mode: NamespaceMode::Node as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Why a pod asking for its own user namespace (`hostUsers: false`) is
/// not given a sandbox, as upstream's GetOrCreateUserNamespaceMappings
/// words it; `handlers` are the runtime's handlers and whether each
/// supports user namespaces (CRI Status), `handler` the pod's.
///
/// Upstream allocates ID mappings where the handler supports them;
/// rkubelet does not yet, so it refuses those pods too rather than run
/// them in the node's user namespace, which is what they asked not to be.
pub fn user_namespace_refusal(
    pod: &Pod,
    handlers: &[(String, bool)],
    handler: &str,
) -> Option<String> {
    if pod.spec.as_ref()?.host_users != Some(false) {
        return None;
    }
    let unsupported = if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".to_string()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    };
    // An old runtime reports no handlers: no support, no error.
    if handlers.is_empty() {
        return Some(unsupported);
    }
    Some(match handlers.iter().find(|(name, _)| name == handler) {
        None => format!("{unsupported}: the handler {handler:?} is not known"),
        Some((_, false)) => unsupported,
        Some((_, true)) => {
            "can't set `spec.hostUsers: false`: rkubelet does not allocate user namespace ID mappings yet".into()
        }
    })
}

/// Parses nameserver/search/options lines of a resolv.conf.
fn parse_resolv_conf(text: &str) -> v1::DnsConfig {
    let mut d = v1::DnsConfig::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => d.servers.extend(f.next().map(String::from)),
            Some("search") => d.searches = f.map(String::from).collect(),
            Some("options") => d.options.extend(f.map(String::from)),
            _ => {}
        }
    }
    d
}

/// The sandbox DNS config for the pod's dnsPolicy, as upstream computes it.
pub fn dns_config(opts: &RuntimeOptions, pod: &Pod) -> v1::DnsConfig {
    let spec = pod.spec.as_ref();
    let host_net = spec.and_then(|s| s.host_network).unwrap_or(false);
    let mut policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    if policy == "ClusterFirstWithHostNet" {
        policy = "ClusterFirst";
    } else if policy == "ClusterFirst" && host_net {
        // Upstream: ClusterFirst on the host network means the host's DNS.
        policy = "Default";
    }
    if policy == "ClusterFirst" && opts.cluster_dns.is_empty() {
        tracing::debug!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "ClusterFirst policy but no clusterDNS configured, falling back to Default"
        );
        policy = "Default";
    }
    let host = || {
        if opts.resolv_conf.as_os_str().is_empty() {
            return v1::DnsConfig::default();
        }
        std::fs::read_to_string(&opts.resolv_conf)
            .map(|t| parse_resolv_conf(&t))
            .unwrap_or_default()
    };
    let mut d = match policy {
        "None" => v1::DnsConfig::default(),
        "Default" => host(),
        _ => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let dom = &opts.cluster_domain;
            let mut searches = Vec::new();
            if !dom.is_empty() {
                searches = vec![format!("{ns}.svc.{dom}"), format!("svc.{dom}"), dom.clone()];
            }
            searches.extend(host().searches);
            v1::DnsConfig {
                servers: opts.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        d.servers
            .extend(extra.nameservers.iter().flatten().cloned());
        d.searches.extend(extra.searches.iter().flatten().cloned());
        for o in extra.options.iter().flatten() {
            let opt = match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let key = opt.split(':').next().unwrap_or_default().to_string();
            d.options
                .retain(|x| x.split(':').next() != Some(key.as_str()));
            d.options.push(opt);
        }
    }
    // Upstream limits: 3 nameservers, 32 search domains.
    d.servers.truncate(3);
    d.searches.dedup();
    d.searches.truncate(32);
    d
}

/// Upstream GeneratePodHostNameAndDomain: (hostname, domain). The hostname
/// is spec.hostname or the pod name, cut to 63 characters; the domain is set
/// when a subdomain is given and the cluster has a domain.
pub fn hostname_and_domain(opts: &RuntimeOptions, pod: &Pod) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let mut h = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
    h.truncate(63);
    let h = h.trim_end_matches(['-', '.']).to_string();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|d| !d.is_empty() && !opts.cluster_domain.is_empty())
        .map(|sub| format!("{sub}.{ns}.svc.{}", opts.cluster_domain));
    (h, domain)
}

/// The kubelet-managed /etc/hosts (upstream managedHostsFileContent): the
/// host's file for host-network pods, else localhost entries and the pod's
/// own name; hostAliases appended either way.
pub fn hosts_file(opts: &RuntimeOptions, pod: &Pod, pod_ips: &[String]) -> String {
    let spec = pod.spec.as_ref();
    let mut out = String::new();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        out = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
    } else {
        out.push_str("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n");
        let (host, domain) = hostname_and_domain(opts, pod);
        for ip in pod_ips {
            match &domain {
                Some(d) => out.push_str(&format!("{ip}\t{host}.{d}\t{host}\n")),
                None => out.push_str(&format!("{ip}\t{host}\n")),
            }
        }
    }
    let aliases = spec
        .and_then(|s| s.host_aliases.as_ref())
        .filter(|a| !a.is_empty());
    if let Some(aliases) = aliases {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.clone().unwrap_or_default().join("\t");
            out.push_str(&format!("{}\t{names}\n", a.ip));
        }
    }
    out
}

/// The seccomp profile for a container (or the sandbox when `c` is None):
/// the container's own, else the pod's, else RuntimeDefault with
/// seccompDefault or Unconfined (upstream getSeccompProfile).
pub fn seccomp_profile(
    opts: &RuntimeOptions,
    pod: &Pod,
    c: Option<&k8s_openapi::api::core::v1::Container>,
) -> v1::SecurityProfile {
    use v1::security_profile::ProfileType;
    let own = c
        .and_then(|c| c.security_context.as_ref())
        .and_then(|sc| sc.seccomp_profile.as_ref());
    let pod_level = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.seccomp_profile.as_ref());
    match own.or(pod_level) {
        Some(p) if p.type_ == "RuntimeDefault" => v1::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        Some(p) if p.type_ == "Localhost" => v1::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: opts
                .root_dir
                .join("seccomp")
                .join(p.localhost_profile.clone().unwrap_or_default())
                .to_string_lossy()
                .into_owned(),
        },
        Some(_) => v1::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
        None if opts.seccomp_default => v1::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        None => v1::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
    }
}

pub fn sandbox_config(opts: &RuntimeOptions, pod: &Pod, attempt: u32) -> v1::PodSandboxConfig {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let host_net = spec.and_then(|s| s.host_network).unwrap_or(false);
    let hostname = if host_net {
        String::new()
    } else {
        let mut h = spec
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| m.name.clone().unwrap_or_default());
        h.truncate(63);
        h.trim_end_matches(['-', '.']).to_string()
    };
    let mut port_mappings = Vec::new();
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or(&[]) {
        for p in c.ports.iter().flatten() {
            let Some(host_port) = p.host_port.filter(|p| *p > 0) else {
                continue;
            };
            let protocol = match p.protocol.as_deref() {
                Some("UDP") => v1::Protocol::Udp,
                Some("SCTP") => v1::Protocol::Sctp,
                _ => v1::Protocol::Tcp,
            };
            port_mappings.push(v1::PortMapping {
                protocol: protocol as i32,
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    let privileged = spec
        .into_iter()
        .flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
        })
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|sc| sc.privileged)
                .unwrap_or(false)
        });
    let sysctls = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.sysctls.as_ref())
        .map(|v| {
            // Upstream ConvertPodSysctlsVariableToDotsSeparator: the
            // runtime gets the dotted form.
            v.iter()
                .map(|s| {
                    (
                        crate::lifecycle::sysctl::normalize_name(&s.name),
                        s.value.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let psc = spec.and_then(|s| s.security_context.as_ref());
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
            attempt,
        }),
        hostname,
        log_directory: pod_log_dir(opts, pod),
        dns_config: Some(dns_config(opts, pod)),
        port_mappings,
        labels: labels::sandbox_labels(pod),
        annotations: labels::sandbox_annotations(pod),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: crate::cm::pod_cgroup_parent(
                pod,
                &opts.cgroup_root,
                opts.systemd_cgroups,
            ),
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged,
                seccomp: Some(seccomp_profile(opts, pod, None)),
                // Upstream's sandbox context is the pod's effective one:
                // its user and group, and its supplementary groups with
                // the fsGroup among them.
                run_as_user: psc
                    .and_then(|s| s.run_as_user)
                    .map(|value| v1::Int64Value { value }),
                run_as_group: psc
                    .and_then(|s| s.run_as_group)
                    .map(|value| v1::Int64Value { value }),
                supplemental_groups: supplemental_groups(psc),
                supplemental_groups_policy: supplemental_groups_policy(psc),
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    }
}

/// The pod's `supplementalGroupsPolicy` in CRI terms (Merge, the default,
/// or Strict), for the sandbox and each container.
pub(crate) fn supplemental_groups_policy(
    psc: Option<&k8s_openapi::api::core::v1::PodSecurityContext>,
) -> i32 {
    match psc.and_then(|s| s.supplemental_groups_policy.as_deref()) {
        Some("Strict") => v1::SupplementalGroupsPolicy::Strict as i32,
        _ => v1::SupplementalGroupsPolicy::Merge as i32,
    }
}

/// The pod's supplementary groups with its fsGroup among them (upstream's
/// effective security context, for the sandbox and every container), so
/// processes can use the pod's volumes.
pub(crate) fn supplemental_groups(
    psc: Option<&k8s_openapi::api::core::v1::PodSecurityContext>,
) -> Vec<i64> {
    psc.and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default()
        .into_iter()
        .chain(psc.and_then(|s| s.fs_group))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supplemental_groups_policy_reaches_the_runtime() {
        // Old code: the policy was dropped, so Strict ran as Merge.
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"securityContext": {"supplementalGroupsPolicy": "Strict"},
                     "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        let cfg = sandbox_config(&RuntimeOptions::default(), &pod, 0);
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(
            sc.supplemental_groups_policy,
            v1::SupplementalGroupsPolicy::Strict as i32
        );
        let psc = pod.spec.as_ref().unwrap().security_context.as_ref();
        assert_eq!(supplemental_groups_policy(psc), 1);
        assert_eq!(supplemental_groups_policy(None), 0);
    }

    #[test]
    fn user_namespaces_as_upstreams_userns_manager() {
        // Old code: hostUsers was ignored (a pod asking for its own user
        // namespace ran in the node's) and no user namespace was named.
        let mut p = Pod {
            spec: Some(Default::default()),
            ..Default::default()
        };
        let node = namespace_options(&p).userns_options.unwrap();
        assert_eq!(node.mode, NamespaceMode::Node as i32);
        assert!(node.uids.is_empty());
        assert_eq!(user_namespace_refusal(&p, &[], ""), None);
        p.spec.as_mut().unwrap().host_users = Some(true);
        assert_eq!(user_namespace_refusal(&p, &[], ""), None);
        p.spec.as_mut().unwrap().host_users = Some(false);
        let base = "can't set `spec.hostUsers: false`, runtime does not support user namespaces";
        assert_eq!(user_namespace_refusal(&p, &[], "").as_deref(), Some(base));
        let handlers = [(String::new(), false), ("kata".to_string(), true)];
        assert_eq!(
            user_namespace_refusal(&p, &handlers, "").as_deref(),
            Some(base)
        );
        assert_eq!(
            user_namespace_refusal(&p, &handlers, "gvisor").as_deref(),
            Some(
                "can't set `spec.hostUsers: false`, RuntimeClass handler \"gvisor\" does not \
                 support user namespaces: the handler \"gvisor\" is not known"
            )
        );
        // Supported, but rkubelet allocates no mappings: still refused.
        assert!(user_namespace_refusal(&p, &handlers, "kata")
            .is_some_and(|m| m.contains("does not allocate user namespace ID mappings")));
    }

    #[test]
    fn the_sandbox_runs_with_the_pods_user_and_groups_fs_group_included() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "securityContext": {
                "runAsUser": 1000, "runAsGroup": 3000,
                "supplementalGroups": [4000], "fsGroup": 2000}}
        }))
        .unwrap();
        let cfg = sandbox_config(&RuntimeOptions::default(), &pod, 0);
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1000));
        assert_eq!(sc.run_as_group.map(|v| v.value), Some(3000));
        assert_eq!(sc.supplemental_groups, vec![4000, 2000]);
        let plain: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": []}
        }))
        .unwrap();
        let sc = sandbox_config(&RuntimeOptions::default(), &plain, 0)
            .linux
            .unwrap()
            .security_context
            .unwrap();
        assert!(sc.run_as_user.is_none() && sc.supplemental_groups.is_empty());
    }

    #[test]
    fn resolv_conf_is_parsed() {
        let d = parse_resolv_conf(
            "# c\nnameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch a b\noptions ndots:2 edns0\n",
        );
        assert_eq!(d.servers, vec!["1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.searches, vec!["a", "b"]);
        assert_eq!(d.options, vec!["ndots:2", "edns0"]);
    }

    #[test]
    fn cluster_first_uses_cluster_dns_and_search_path() {
        let opts = RuntimeOptions {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            resolv_conf: "".into(),
            ..RuntimeOptions::default()
        };
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("kube-system".into());
        let d = dns_config(&opts, &pod);
        assert_eq!(d.servers, vec!["10.96.0.10"]);
        assert_eq!(d.searches[0], "kube-system.svc.cluster.local");
        assert_eq!(d.options, vec!["ndots:5"]);
    }

    #[test]
    fn hosts_file_has_the_pod_name_fqdn_and_aliases() {
        let opts = RuntimeOptions {
            cluster_domain: "cluster.local".into(),
            ..RuntimeOptions::default()
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-0".into());
        pod.metadata.namespace = Some("ns".into());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            subdomain: Some("web".into()),
            host_aliases: Some(vec![k8s_openapi::api::core::v1::HostAlias {
                ip: "10.1.2.3".into(),
                hostnames: Some(vec!["foo".into(), "bar".into()]),
            }]),
            ..Default::default()
        });
        let h = hosts_file(&opts, &pod, &["10.88.0.4".into()]);
        assert!(h.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(h.contains("10.88.0.4\tweb-0.web.ns.svc.cluster.local\tweb-0\n"));
        assert!(h.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo\tbar\n"));
    }

    #[test]
    fn seccomp_falls_back_from_container_to_pod_to_default() {
        use k8s_openapi::api::core::v1::{PodSecurityContext, SeccompProfile, SecurityContext};
        use v1::security_profile::ProfileType;
        let mut opts = RuntimeOptions::default();
        let mut pod = Pod {
            spec: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(
            seccomp_profile(&opts, &pod, None).profile_type,
            ProfileType::Unconfined as i32
        );
        opts.seccomp_default = true;
        assert_eq!(
            seccomp_profile(&opts, &pod, None).profile_type,
            ProfileType::RuntimeDefault as i32
        );
        pod.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "Localhost".into(),
                localhost_profile: Some("p.json".into()),
            }),
            ..Default::default()
        });
        let p = seccomp_profile(&opts, &pod, None);
        assert_eq!(
            (p.profile_type, p.localhost_ref.as_str()),
            (
                ProfileType::Localhost as i32,
                "/var/lib/kubelet/seccomp/p.json"
            )
        );
        let c = k8s_openapi::api::core::v1::Container {
            security_context: Some(SecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "Unconfined".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            seccomp_profile(&opts, &pod, Some(&c)).profile_type,
            ProfileType::Unconfined as i32
        );
    }
}
